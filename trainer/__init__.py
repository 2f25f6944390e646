"""The GRPO trainer, its staleness-bounded rollout buffer and policy publishing.

Invariant: depends on `rollnet.node`, never the reverse.
"""
