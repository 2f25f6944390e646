"""The trainer's gate for rollouts from the market: a batch enters the buffer only once it is accepted.

Invariant: a submitted batch's rollouts reach the buffer only if the verdict book admits it (its first
committee accepted it, no member objected, and either the accepting members hold a stake majority or the
vote window closed: see rollnet.node.verdicts) or the chain records a final acceptance (settled, or an
appeal window passed), and the bytes in hand hash to that root; the buffer's own staleness and validity
rules then apply to each rollout. Rewards are never taken from the batch (the trainer recomputes them from
the completions).
"""

from __future__ import annotations

from collections import Counter

from rollnet.node.p2p.objects import object_root
from rollnet.node.rollout.submission import SubmissionError, parse_submission
from rollnet.node.verdicts import VerdictBook
from rollnet.trainer.buffer import RolloutBuffer


def admit_submission(data: bytes, lease_id: int, root: bytes, book: VerdictBook, buffer: RolloutBuffer,
                     accepted_on_chain: bool = False) -> Counter:
    """Offer one submitted batch; returns the buffer's counts for it, or {"no quorum": n} / {"refused": 1}.
    `accepted_on_chain` is true only when the caller read the lease's final outcome on chain as accepted."""
    if not (accepted_on_chain or book.admitted(lease_id, root)):
        return Counter({"no quorum": 1})
    if object_root(data) != root:
        return Counter({"refused": 1})
    try:
        submission = parse_submission(data)
        rollouts = submission.rollout_batch().to_rollouts()
    except SubmissionError:
        return Counter({"refused": 1})
    if submission.header.lease_id != lease_id:
        return Counter({"refused": 1})
    return buffer.admit_all(rollouts)
