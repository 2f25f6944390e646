"""User-facing errors.

Invariant: every mistake a user can make (bad input, a dead endpoint, a wrong password) surfaces as a
`RollnetError` whose message is one readable line; the CLI prints it without a traceback and exits 1.
"""


class RollnetError(Exception):
    """A failure explained in one line, caused by input or environment rather than a bug."""


class ConfigError(RollnetError):
    """A configuration or spec file is missing, malformed or out of range."""


class PolicyUnavailable(ConfigError):
    """This node does not (yet) hold the policy version asked for."""


class KeystoreError(RollnetError):
    """A keystore is missing, unreadable, or its password is wrong."""


class ChainUnavailable(RollnetError):
    """The chain endpoint does not answer."""


class TransactionNotSent(ChainUnavailable):
    """The chain stopped answering before a transaction was signed (its gas estimate or fees): no nonce is spent
    and nothing reached the node, so sending it again is safe."""


class WrongChain(RollnetError):
    """The endpoint answers with a different chain id than the deployment expects."""


class ContractRevert(RollnetError):
    """A contract call reverted; the message names the decoded custom error."""

    def __init__(self, message: str, error_name: str | None = None, args: dict | None = None):
        super().__init__(message)
        self.error_name = error_name
        self.error_args = args or {}


class TransactionTimeout(RollnetError):
    """A transaction was sent but no receipt arrived in time."""


class DeltaError(RollnetError):
    """A policy delta cannot be applied; the weights it was given are left exactly as they were."""


class WrongBase(DeltaError):
    """The delta was made against a different version than the one held."""


class CorruptDelta(DeltaError):
    """The delta's bytes are malformed, truncated or do not match their hashes."""


class BadSignature(DeltaError):
    """The delta is not signed by the expected trainer."""


class UnsupportedDelta(DeltaError):
    """The delta, or the weights it is applied to, uses what this codec cannot carry or write in place: a dtype
    outside the format, a tensor whose elements overlap in memory, or a size beyond the node's bound."""


def first_validation_problem(exc: Exception) -> str:
    """'field.path: message' for the first problem of a pydantic ValidationError, for one-line errors."""
    errors = exc.errors()  # type: ignore[attr-defined]
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"]) or "the input"
    return f"{where}: {first['msg']}"
