"""Sampled verification: which of a lease's rollouts a first-round committee member verifies.

Format. A lease holds n = group_size x tasks_per_lease rollouts, indexed in lease order: rollout i is
sample i % group_size of the lease's task i // group_size (the order `worker.leased_instances` gives). The
spec's `samples_checked` = m says how many each first-round member verifies. Member M of lease L of job J
signs (EIP-191 personal message, eth-account's deterministic RFC 6979 signature) the 32 bytes
keccak256(seed || J as address || L as uint256), where `seed` is the round-0 committee seed
(`TrainingJob.roundSeed`, fixed by the block after submission); its 65-byte signature S drives a partial
Fisher-Yates shuffle of 0..n-1: step j swaps position j with position j + (keccak256(S || j as uint256) mod
(n - j)); the first m positions are the sample, returned sorted.

Why a signature: the worker could not know the seed when it committed to its batch, and once the seed is
public it still cannot compute any member's sample (that needs the member's key), so it cannot serve its
batch only to the members whose samples miss its fakes. Each member's sample is its own (independent draws
across members). A member that reveals S lets anyone check it (ecrecover to M) and recompute the sample.
A member could sign with a nonce of its own choosing to pick among samples; that buys it nothing a member
that skips verification would not have, and an honest member's sample is fixed by its key. Appeal rounds
verify everything.

Invariants: the functions are pure; a sample has exactly min(m, n) distinct indices in [0, n); the same
inputs give the same sample on every machine. The sizing rule that m must satisfy lives in
`JobFactory.validateSpec` alone; `catch_probability` is its formula, for reports.
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, Decimal

from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount
from eth_utils import keccak, to_canonical_address

PPM = 1_000_000  # JobFactory.PPM: cheat fractions are in parts per million


def samples_checked(fraction: Decimal, rollouts: int) -> int:
    """Rollouts each member verifies for a sampled `fraction` of a lease of `rollouts`: ceil(f x n), in [1, n]."""
    if not 0 < fraction <= 1:
        raise ValueError(f"a sampled fraction is in (0, 1], got {fraction}")
    return max(1, min(rollouts, int((fraction * rollouts).to_integral_value(rounding=ROUND_CEILING))))


def catch_probability(cheat_fraction: float, samples: int, committee_size: int) -> float:
    """The sizing rule's chance that a lease with a fraction `cheat_fraction` of faked rollouts is caught:
    1 - (1 - c)^(m x q), independent draws (the contract computes the same in fixed point)."""
    return 1.0 - (1.0 - cheat_fraction) ** (samples * committee_size)


def expected_leases_until_caught(cheat_fraction: float, samples: int, committee_size: int) -> float:
    """1 / P(c): the mean of the geometric number of leases a cheater submits until one is caught."""
    chance = catch_probability(cheat_fraction, samples, committee_size)
    return math.inf if chance <= 0 else 1.0 / chance


def sample_message(seed: bytes, job: str, lease_id: int) -> bytes:
    """The 32 bytes a member signs to draw its sample of `lease_id` (see the format)."""
    if len(seed) != 20 or not any(seed):
        raise ValueError("a sample needs the round's 20-byte committee seed (zero: not drawn yet)")
    return keccak(seed + to_canonical_address(job) + lease_id.to_bytes(32, "big"))


def sampled_indices(seed: bytes, job: str, lease_id: int, member: LocalAccount, rollouts: int,
                    samples: int) -> list[int]:
    """The sorted indices (lease order) of the rollouts `member` verifies in round 0 of `lease_id`."""
    if rollouts < 1 or samples < 1:
        raise ValueError("a sample needs at least one rollout and one sample")
    signature = member.sign_message(encode_defunct(primitive=sample_message(seed, job, lease_id))).signature
    return indices_from_signature(bytes(signature), rollouts, samples)


def indices_from_signature(signature: bytes, rollouts: int, samples: int) -> list[int]:
    """The sample a member's signature draws (anyone can recompute it from a revealed signature)."""
    order = list(range(rollouts))
    for j in range(min(samples, rollouts)):
        word = int.from_bytes(keccak(signature + j.to_bytes(32, "big")), "big")
        k = j + word % (rollouts - j)
        order[j], order[k] = order[k], order[j]
    return sorted(order[: min(samples, rollouts)])
