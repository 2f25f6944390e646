"""The `rollnet` sub-commands every participant has: keys, chain, node, job.

Invariant: command functions only parse, call the library, and print; every user mistake reaches them
as a RollnetError and is printed by `rollnet.cli.main` as one line.
"""
