"""Signed gossip messages: policy announcements, the trainer's demand, `have` announcements and validator verdicts.

Wire form: a JSON object {"kind", "body", "signer", "signature"}; body fields are checked by a pydantic
model per kind; the signature is an EIP-191 signature by `signer` over blake3("rollnet-gossip-v1" |
canonical JSON of kind, body and signer). Invariants: a message over `MAX_MESSAGE` bytes, of an unknown
kind, with a malformed body or a signature that does not recover to `signer` is refused before anything
acts on it; `ReplayGuard` admits each (signer, kind, nonce) once and only within its time window.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from typing import Annotated, Literal

import blake3
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount
from eth_utils import is_checksum_address
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

MAX_MESSAGE = 16 * 1024
DOMAIN = b"rollnet-gossip-v1"
Hex32 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


def _checksummed(value: str) -> str:
    if not is_checksum_address(value):
        raise ValueError("job must be a checksummed address")
    return value


JobAddress = Annotated[str, AfterValidator(_checksummed)]  # a job named on the wire: checksummed, or refused


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    job: JobAddress
    nonce: int = Field(ge=0)
    timestamp: float = Field(allow_inf_nan=False)  # NaN would slip past the replay window's comparison


class PolicyAnnouncement(Body):
    """The trainer announces version `version`: its content root and the delta from `base_version`."""

    version: int = Field(ge=1)
    base_version: int = Field(ge=0)
    target_root: Hex32
    delta_root: Hex32
    delta_size: int = Field(ge=1)


MAX_GROUPS = 10_000_000  # more groups than any step or queue holds: anything above is refused as malformed


class Demand(Body):
    """What the trainer's demand for leases depends on (see rollnet.node.demand): the version it will be at once
    its step in progress is done, its prompts per step, the groups it has or has in flight (`supply_groups`), its
    steps left (None: no target), and the job's `leaseCount` when it counted (`claims_seen`). Advisory: claims stay
    open on chain; an honest worker claims no more than it leaves."""

    version: int = Field(ge=0)
    prompts_per_step: int = Field(ge=1, le=MAX_GROUPS)
    supply_groups: int = Field(ge=0, le=MAX_GROUPS)
    steps_left: int | None = Field(default=None, ge=0)
    claims_seen: int = Field(ge=0)


class Have(Body):
    """`peer_id` (registered to the signer) holds the object `root`, wholly or in part."""

    peer_id: str = Field(min_length=10, max_length=100)
    root: Hex32
    complete: bool


class Verdict(Body):
    """A validator's verdict on a submitted rollout batch."""

    lease_id: int = Field(ge=0)
    batch_root: Hex32
    accept: bool
    reason: str = Field(max_length=200)


KINDS: dict[str, type[Body]] = {"policy": PolicyAnnouncement, "demand": Demand, "have": Have, "verdict": Verdict}


class EnvelopeError(ValueError):
    """The message is malformed, oversized, unsigned or signed by someone else."""


class Envelope(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["policy", "demand", "have", "verdict"]
    body: dict
    signer: str
    signature: str = Field(pattern=r"^0x[0-9a-f]{130}$")

    def parsed(self) -> Body:
        return KINDS[self.kind].model_validate(self.body)


def _digest(kind: str, body: dict, signer: str) -> bytes:
    canonical = json.dumps({"kind": kind, "body": body, "signer": signer}, sort_keys=True, separators=(",", ":"))
    return blake3.blake3(DOMAIN + canonical.encode()).digest()


def seal(body: Body, account: LocalAccount) -> bytes:
    kind = next(name for name, model in KINDS.items() if isinstance(body, model))
    fields = body.model_dump(mode="json")
    signature = account.sign_message(encode_defunct(primitive=_digest(kind, fields, account.address))).signature
    envelope = {"kind": kind, "body": fields, "signer": account.address, "signature": "0x" + bytes(signature).hex()}
    data = json.dumps(envelope, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE:
        raise EnvelopeError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    return data


def open_envelope(data: bytes) -> tuple[Envelope, Body]:
    """Parse, schema-check and verify a gossip message; raises EnvelopeError."""
    if len(data) > MAX_MESSAGE:
        raise EnvelopeError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    try:
        envelope = Envelope.model_validate_json(data)
        body = envelope.parsed()
    except ValidationError as exc:
        raise EnvelopeError(f"malformed message: {exc.errors()[0]['msg']}") from None
    try:
        recovered = Account.recover_message(encode_defunct(primitive=_digest(envelope.kind, envelope.body,
                                                                             envelope.signer)),
                                            signature=envelope.signature)
    except Exception:  # noqa: BLE001 - eth_keys raises several types for junk
        raise EnvelopeError("malformed signature") from None
    if recovered != envelope.signer:
        raise EnvelopeError(f"signature is by {recovered}, not the claimed signer {envelope.signer}")
    return envelope, body


class ReplayGuard:
    """Admits each (signer, kind, nonce) once, within `window` seconds of its timestamp; bounded memory."""

    def __init__(self, window: float = 300.0, capacity: int = 100_000):
        self.window = window
        self.capacity = capacity
        self._seen: OrderedDict[tuple[str, str, int], float] = OrderedDict()

    def admit(self, envelope: Envelope, body: Body, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        if abs(now - body.timestamp) > self.window:
            return False
        key = (envelope.signer, envelope.kind, body.nonce)
        if key in self._seen:
            return False
        self._seen[key] = body.timestamp
        while len(self._seen) > self.capacity or (self._seen and next(iter(self._seen.values())) < now - self.window):
            self._seen.popitem(last=False)
        return True
