"""Committee membership computed where the validator is, as TrainingJob computes it, from what the lease book
already holds: a round's start block and its hash (from the event that opened the round), or the seed and total
weight the round's CommitteeDrawn event stated.

The contract's rule (TrainingJob._committeeSeed and _memberWeight), with k the round's expected committee size
(every validator in the final round), w the member's and W all validators' weight at the end of block start-1:

    seed    = bytes20(keccak256(abi.encode(blockhash(start), job, leaseId, round)))   (1 if that is 0)
    weight  = 0                                   if W = 0, the member is the lease's worker, or w = 0
            = w                                   if the round is final or k·w >= W
            = W / k   (integer division)          if keccak256(abi.encode(seed, leaseId, round, member)) mod W < k·w
            = 0                                   otherwise

Invariant: `CommitteeView.weight` is what `TrainingJob.memberWeight` answers for the same lease, round and
member, asked of the block after the book's head (the round's start block's hash recoverable there, or the
round drawn), and None while the book has not seen the round start. The registry's weights come from its
events (`rollnet.node.weight_history`), so membership costs no read per lease, round, start block or
validator: `memberWeight` asked of every lease made a market's membership calls grow as leases times
validators, and a read per start block still grew with the lease rate (bench/scale.py, 1,000 x 50).
`drew_nobody` is the same answer for every validator with weight at once: a round nobody could vote in.
"""

from __future__ import annotations

from eth_abi import encode
from eth_utils import keccak
from rollnet.node.chain.job import JobClient
from rollnet.node.chain.registry import RegistryClient
from rollnet.node.lease_book import LeaseEntry
from rollnet.node.weight_history import WeightHistory

BLOCKHASH_WINDOW = 256  # the EVM's BLOCKHASH answers only for the last 256 blocks


def committee_seed(block_hash: bytes, job: str, lease_id: int, round_: int) -> bytes:
    """The round's 20-byte committee seed from its start block's hash (TrainingJob._committeeSeed)."""
    seed = keccak(encode(["bytes32", "address", "uint256", "uint256"], [block_hash, job, lease_id, round_]))[:20]
    return seed if any(seed) else (1).to_bytes(20, "big")


def member_weight(seed: bytes, total: int, weight: int, committee_size: int | None, lease_id: int, round_: int,
                  member: str, worker: str) -> int:
    """A member's vote weight in a round (TrainingJob._memberWeight): `weight` and `total` at the round's start,
    `committee_size` None in the final round (everyone sits)."""
    if total == 0 or not any(seed) or member.lower() == worker.lower() or weight == 0:
        return 0
    if committee_size is None or committee_size * weight >= total:
        return weight
    draw = keccak(encode(["bytes20", "uint256", "uint256", "address"], [seed, lease_id, round_, member]))
    return total // committee_size if int.from_bytes(draw, "big") % total < committee_size * weight else 0


class CommitteeView:
    """One account's committee seats in a job's rounds, from the lease book's entries and the registry's weight
    history (`WeightHistory`, followed from `from_block`: the registry's deployment block)."""

    def __init__(self, job: JobClient, registry: RegistryClient, from_block: int):
        self.job = job
        self.registry = registry
        self.weights = WeightHistory(registry, from_block)
        self._sizes: dict[int, int | None] = {}

    def weight(self, entry: LeaseEntry, round_: int, member: str, head: int) -> int | None:
        """`member`'s weight in the entry's round `round_` as the block after `head` sees it; None while no event
        told the book the round's start (the contract's view, asked of that block, needs the same hash)."""
        start = entry.starts.get(round_)
        if start is None:
            return None
        block, block_hash = start
        if round_ in entry.seeds:  # drawn: the stored seed and total are what the contract reads from now on
            seed, total = bytes.fromhex(entry.seeds[round_]), entry.totals[round_]
        elif head + 1 - block > BLOCKHASH_WINDOW:
            return 0  # never drawn, and the next block cannot read the start block's hash: no committee
        else:
            seed = committee_seed(bytes.fromhex(block_hash), self.job.address, entry.lease_id, round_)
            total = self.weights.total_at(block - 1)
        own = self.weights.weight_at(member, block - 1)
        return member_weight(seed, total, own, self._committee_size(round_), entry.lease_id, round_, member,
                             entry.worker)

    def _committee_size(self, round_: int) -> int | None:
        if round_ not in self._sizes:
            self._sizes[round_] = self.job.committee_size(round_)
        return self._sizes[round_]


def drew_nobody(view: CommitteeView, entry: LeaseEntry, round_: int, head: int) -> bool:
    """Whether the round's draw seated no validator although validators with weight existed (a round nobody could
    vote in; the contract seats any validator with weight, enlisted or not). False whenever that is not known:
    the round's start not seen, no validator weight at all, or randomness never drawn and now past the 256-block
    window (then the members drawn may simply have stayed away, and an appeal to a larger committee of the same
    validators would only burn the bond)."""
    start = entry.starts.get(round_)
    if start is None:
        return False
    if round_ not in entry.seeds and head + 1 - start[0] > BLOCKHASH_WINDOW:
        return False
    weighted = [v for v in view.weights.weighted_at(start[0] - 1) if v.lower() != entry.worker.lower()]  # never seated
    total = entry.totals[round_] if round_ in entry.seeds else view.weights.total_at(start[0] - 1)
    return total > 0 and bool(weighted) and all(view.weight(entry, round_, validator, head) == 0
                                                for validator in weighted)
