"""rollnet: a permissionless compute market for RL post-training.

Invariant: this namespace only composes the role packages (`rollnet.node`, `rollnet.validator`,
`rollnet.trainer`); it holds no logic of its own beyond the CLI entry point.
"""

__version__ = "0.1.0"
