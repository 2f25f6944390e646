"""A worker's signed submission for one lease: which job and lease, which policy, and the rollout batch.

Wire form: UTF-8 JSON {"header": {...}, "batch": {...}, "signature": "0x..."}; the on-chain commitment is
the object root of these exact bytes (the same root the transfer protocol fetches by). The signature is
an EIP-191 personal signature by the lease holder over keccak256("rollnet-submission-v1" | canonical JSON
of header and batch), so a submission cannot be replayed under another lease, job or worker without
failing either its signature or its header check. Invariant: `parse(make(...).to_bytes())` round-trips,
and `parse` of anything malformed raises SubmissionError naming the problem, never a traceback.
"""

from __future__ import annotations

import json

from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount
from eth_utils import keccak
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rollnet.node import toploc
from rollnet.node.errors import ConfigError, RollnetError, first_validation_problem
from rollnet.node.rollout.wire import MAX_PROMPT_TOKENS, RolloutBatch

DOMAIN = b"rollnet-submission-v1"
# Bytes of JSON an honest submission can spend, at most, on each part of one rollout (see `max_submission_bytes`).
TOKEN_ID_JSON = len("4294967295,")  # the largest token id and its comma
LOGPROB_JSON = len("-1.7976931348623157e+308,")  # the longest float repr and its comma
TOKEN_TEXT_JSON = 6 * 256  # a token's text: up to 256 characters, each at worst a 6-character JSON escape
PROOF_JSON = 2 * toploc.PROOF_BYTES + len('"",')  # one 32-position chunk's proof as quoted hex
RECORD_JSON = 1024  # field names, seeds, reward, brackets
SUBMISSION_JSON = 64 * 1024  # header, task name, policy root, signature


class SubmissionError(RollnetError):
    """A submission that cannot be parsed or whose signature does not hold."""


class SubmissionHeader(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    job: str
    lease_id: int = Field(ge=0)
    worker: str
    policy_version: int = Field(ge=0)


class Submission(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    header: SubmissionHeader
    batch: dict
    signature: str

    def digest(self) -> bytes:
        return _digest(self.header, self.batch)

    def signer(self) -> str:
        try:
            return Account.recover_message(encode_defunct(primitive=self.digest()), signature=self.signature)
        except Exception as exc:  # noqa: BLE001 - any malformed signature is the same mistake
            raise SubmissionError(f"unreadable signature ({exc})") from None

    def rollout_batch(self) -> RolloutBatch:
        try:
            return RolloutBatch.from_json(json.dumps(self.batch))
        except ConfigError as exc:
            raise SubmissionError(str(exc)) from None

    def to_bytes(self) -> bytes:
        return json.dumps({"header": self.header.model_dump(), "batch": self.batch, "signature": self.signature},
                          sort_keys=True, separators=(",", ":")).encode()


def max_submission_bytes(rollouts: int, max_new_tokens: int) -> int:
    """The most bytes an honest signed submission of `rollouts` rollouts of at most `max_new_tokens` completion
    tokens can take (a prompt of up to MAX_PROMPT_TOKENS; generous for each part). Fetchers refuse a manifest that
    declares more before storing a byte, so a worker cannot fill a validator's or the trainer's disk with a batch
    the job's spec could never produce."""
    chunks = -(-max_new_tokens // toploc.CHUNK_TOKENS) + 1
    per_rollout = (RECORD_JSON + MAX_PROMPT_TOKENS * TOKEN_ID_JSON
                   + max_new_tokens * (TOKEN_ID_JSON + LOGPROB_JSON + TOKEN_TEXT_JSON) + chunks * PROOF_JSON)
    return SUBMISSION_JSON + rollouts * per_rollout


def _digest(header: SubmissionHeader, batch: dict) -> bytes:
    body = json.dumps({"header": header.model_dump(), "batch": batch}, sort_keys=True, separators=(",", ":"))
    return keccak(DOMAIN + body.encode())


def make_submission(header: SubmissionHeader, batch: RolloutBatch, signer: LocalAccount) -> Submission:
    content = json.loads(batch.to_json())
    signature = signer.sign_message(encode_defunct(primitive=_digest(header, content))).signature.hex()
    return Submission(header=header, batch=content, signature=signature)


def parse_submission(data: bytes) -> Submission:
    try:
        return Submission.model_validate_json(data)
    except ValidationError as exc:
        raise SubmissionError(f"malformed submission: {first_validation_problem(exc)}") from None
