"""Validators' verdicts as signed gossip, and the quorum rule the trainer admits rollouts by.

A verdict is a `verdict` envelope (p2p.envelopes): validator V says the batch with root R under lease L of
job J is accepted or rejected, and why, signed by V's Ethereum key, so anyone can check it before any
block confirms the votes. Invariant: `VerdictBook.admitted` is true only when at least `quorum` distinct
validators, each active with validator stake when asked, signed an accepting verdict for that exact job,
lease and root; rejecting verdicts never count towards admission; anything unsigned, forged, malformed or
for another job is refused with EnvelopeError and changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from eth_account.signers.local import LocalAccount
from rollnet.node.p2p.envelopes import EnvelopeError, Verdict, open_envelope, seal

MAX_REASON = 200


def seal_verdict(job: str, lease_id: int, root: bytes, accept: bool, reason: str, account: LocalAccount) -> bytes:
    """A signed verdict envelope; the nonce is the lease id (one verdict per validator and lease)."""
    body = Verdict(job=job, nonce=lease_id, timestamp=time.time(), lease_id=lease_id, batch_root=root.hex(),
                   accept=accept, reason=reason[:MAX_REASON])
    return seal(body, account)


class VerdictBook:
    """Collects verdicts; says which leases' batches have an accepting quorum."""

    def __init__(self, job: str, quorum: int, is_active_validator: Callable[[str], bool]):
        self.job = job
        self.quorum = quorum
        self.is_active_validator = is_active_validator
        self._votes: dict[tuple[int, str], dict[str, bool]] = {}

    def add(self, data: bytes) -> Verdict:
        """Record a verdict envelope after checking signature, kind and job (EnvelopeError otherwise)."""
        envelope, body = open_envelope(data)
        if not isinstance(body, Verdict):
            raise EnvelopeError(f"a {envelope.kind} message is not a verdict")
        if body.job.lower() != self.job.lower():
            raise EnvelopeError(f"verdict for job {body.job}, not {self.job}")
        self._votes.setdefault((body.lease_id, body.batch_root), {})[envelope.signer] = body.accept
        return body

    def admitted(self, lease_id: int, root: bytes) -> bool:
        votes = self._votes.get((lease_id, root.hex()), {})
        accepting = [v for v, accept in votes.items() if accept and self.is_active_validator(v)]
        return len(accepting) >= self.quorum

    def rejections(self, lease_id: int, root: bytes) -> list[str]:
        return [v for v, accept in self._votes.get((lease_id, root.hex()), {}).items() if not accept]
