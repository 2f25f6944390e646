"""The `rollnet` sub-commands every participant has: keys, chain, node, job.

Invariant: command functions only parse, call the library, and print; a malformed value never reaches them
(`rollnet.node.cli.params` refuses it while the command line is parsed: exit 2), and every other user
mistake reaches them as a RollnetError and is printed by `rollnet.cli.main` as one line (exit 1).
"""
