"""The validator daemon: fetch, verify, attest, challenge.

Invariant: depends on `rollnet.node`, never the reverse.
"""
