"""What every rollnet participant runs: chain access, keys, configuration and the contributor role.

Invariant: nothing here imports `rollnet.validator` or `rollnet.trainer`; they depend on us.
"""
