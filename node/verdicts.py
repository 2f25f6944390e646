"""Validators' verdicts as signed gossip, and the committee rule the trainer admits rollouts by.

A verdict is a `verdict` envelope (p2p.envelopes): validator V says the batch with root R under lease L of
job J is accepted or rejected, and why, signed by V's Ethereum key, so anyone can check it before any
block confirms the votes. A round-0 vote to accept on chain, for the root the lease book has from the lease's
submission, counts as that member's accepting verdict too: it is sent by the same key, for a lease whose root
cannot change once submitted (the vote names the lease, not the root; the lease book follows the head, so a reorg
that replays a vote is not handled here), and a trainer that restarted after the gossip went by still has it.
Invariant: `VerdictBook.admitted` is true only when (1) the
validators who signed an accepting verdict (by gossip or by their round-0 vote) for that exact job, lease and
root hold, as members of the lease's first committee,
more than half of that round's total validator weight (the rule by which the contract decides a round
early, with the weights the contract computes: `BookCommittee` works them out as `TrainingJob.memberWeight`
does, from the round's start block, as soon as the trainer's lease book has seen it); (2) no member of that
committee signed a rejection; and
(3) either those accepting members hold a majority of all validator stake by their own stake (no minority
can), or the round's vote window has closed, so every drawn member had the whole window to object. A
committee sampled from many validators can be won by a lucky minority; (3) keeps such a round from
reaching the gradient before the honest members could see and contest it. Rejecting verdicts never count
towards admission, and neither does any verdict once a member rejected on chain or round 0 was decided
otherwise than accept (`objected`: a rejection the gossip never carried still counts); anything unsigned,
forged, malformed or for another job is refused with EnvelopeError and changes nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from eth_account.signers.local import LocalAccount
from rollnet.node.chain.job import LeaseStatus, Outcome
from rollnet.node.committee import CommitteeView
from rollnet.node.lease_book import LeaseBook
from rollnet.node.p2p.envelopes import EnvelopeError, Verdict, open_envelope, seal

MAX_REASON = 200


@dataclass(frozen=True)
class Seat:
    """A validator's place on a lease's first committee."""

    weight: int  # its vote weight (0: not a member)
    stake: int  # its own validator weight at the round's snapshot
    total: int  # all validators' weight at that snapshot (0: the committee is not drawn yet)


class Committee(Protocol):
    def seat(self, lease_id: int, validator: str) -> Seat: ...

    def vote_closed(self, lease_id: int) -> bool: ...

    def objected(self, lease_id: int) -> bool: ...

    def accepted_on_chain(self, lease_id: int, root: bytes) -> list[str]: ...


def seal_verdict(job: str, lease_id: int, root: bytes, accept: bool, reason: str, account: LocalAccount) -> bytes:
    """A signed verdict envelope; the nonce is the lease id (one verdict per validator and lease)."""
    body = Verdict(job=job, nonce=lease_id, timestamp=time.time(), lease_id=lease_id, batch_root=root.hex(),
                   accept=accept, reason=reason[:MAX_REASON])
    return seal(body, account)


class BookCommittee:
    """Seats on a lease's first committee and its vote window, from a lease book that follows the job (the round's
    start block and its hash, or its stored draw) and the registry's weight history (`CommitteeView`): the
    contract's own rule, so a seat is known as soon as the round's start block is, without waiting for a first
    vote to draw the committee on chain and without a read per lease or validator."""

    def __init__(self, view: CommitteeView, book: LeaseBook):
        self.view = view
        self.book = book

    def seat(self, lease_id: int, validator: str) -> Seat:
        entry = self.book.get(lease_id)
        weight = self.view.weight(entry, 0, validator, self.book.head) if entry is not None else None
        if entry is None or weight is None:
            return Seat(0, 0, 0)  # not followed (or no longer open): the chain's outcome decides
        start = entry.starts[0][0]
        total = entry.totals[0] if 0 in entry.seeds else self.view.weights.total_at(start - 1)
        stake = self.view.weights.weight_at(validator, start - 1) if weight else 0
        return Seat(weight, stake, total)

    def vote_closed(self, lease_id: int) -> bool:
        """Round 0's vote window is over, judged while it is still voting (then the entry's deadline is the vote
        deadline; once decided it is the appeal deadline, which says nothing about the vote window)."""
        entry = self.book.get(lease_id)
        return (entry is not None and entry.round == 0 and entry.status is LeaseStatus.VOTING
                and self.book.now > entry.deadline)

    def objected(self, lease_id: int) -> bool:
        """A member voted to reject the batch on chain in round 0, or round 0 was decided otherwise than accept:
        gossip that never carried the objection must not outvote the chain."""
        entry = self.book.get(lease_id)
        if entry is None:
            return False
        rejected_on_chain = not all(entry.votes.get(0, {}).values())
        decided_against = (entry.round == 0 and entry.status is LeaseStatus.DECIDED
                           and entry.outcome is not Outcome.ACCEPT)
        return rejected_on_chain or decided_against

    def accepted_on_chain(self, lease_id: int, root: bytes) -> list[str]:
        """The validators whose round-0 vote on chain accepted this lease's batch, if `root` is what was submitted and
        the lease is still in round 0 (once appealed, only the chain's outcome decides)."""
        entry = self.book.get(lease_id)
        if entry is None or entry.round != 0 or entry.root.lower() != root.hex():
            return []
        return [validator for validator, accept in entry.votes.get(0, {}).items() if accept]


class VerdictBook:
    """Collects verdicts; says which leases' batches their first committee accepted, as the trainer needs it."""

    def __init__(self, job: str, committee: Committee):
        self.job = job
        self.committee = committee
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
        accepting_weight, accepting_stake, total = 0, 0, 0
        verdicts = dict(self._votes.get((lease_id, root.hex()), {}))
        for validator in self.committee.accepted_on_chain(lease_id, root):
            verdicts.setdefault(validator, True)  # a rejection by gossip still objects
        for validator, accept in verdicts.items():
            seat = self.committee.seat(lease_id, validator)
            if not seat.weight:
                continue  # not on the committee: neither counts nor objects
            if not accept:
                return False  # a member objects: only the chain's final outcome decides now
            accepting_weight += seat.weight
            accepting_stake += seat.stake
            total = seat.total
        if not total or 2 * accepting_weight <= total or self.committee.objected(lease_id):
            return False
        return 2 * accepting_stake > total or self.committee.vote_closed(lease_id)

    def rejections(self, lease_id: int, root: bytes) -> list[str]:
        return [v for v, accept in self._votes.get((lease_id, root.hex()), {}).items() if not accept]
