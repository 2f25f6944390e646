"""The trainer's demand for leases: how many more batches it can still train on, and what a worker may claim of it.

The trainer gossips what its demand depends on (`Demand`): the version it will be at once the step it is taking is
done (V), its prompts per step P, its supply S, the steps it has left (none: no target) and the claims it had
folded (`claims_seen`). Each worker works the arithmetic out for the chain's version c, the one its batch would be
generated with, so a version that reaches the chain while the trainer trains (and says nothing) counts at once. In
groups (one group is one task's `group_size` completions; a lease holds `tasks_per_lease` of them), with staleness
budget g:
- horizon H = min(g + 1 - (V - c), steps left) * P, at least 0: a batch generated with c can be trained by the
  steps from c to c + g, of which the trainer has g + 1 - (V - c) ahead, the one from V included; never more
  than the steps left to train.
- supply S = the buffer's ready groups (less the step's own, while it takes one) + tasks_per_lease * (leases in
  flight): claimed and not yet presumed lost, or submitted and not yet admitted or refused by the trainer, and
  still fresh enough to train on.
- wanted = ceil((H - S) / tasks_per_lease), at least 0. The trainer trains its oldest groups first, so a batch
  claimed beyond it would wait behind S groups and be trained more than g versions after it was generated
  (dropped as too stale), or never, while the requester pays for it anyway.

A claimed lease counts as in flight until it is submitted or until `presumed_lost_s` after its claim (twice the
claim-to-submission time measured on recent leases, or the whole lease before any was measured); a submitted one
until the trainer admits or refuses it, until its committee decides against it (reject or void: the trainer
refuses it once the appeal window has passed, and an appeal that reverses it only brings a batch more), or until
the vote window and that same time have passed since it was seen submitted (its bytes may never arrive: a worker
that died after submitting). So a lost lease holds the
demand back for a bounded time, never for good.

A worker may claim `unclaimed(...)`: what is wanted less the claims mined since the trainer counted, one lease
per read of the count, so workers that read the same count at once overshoot it by at most one lease each; the
trainer's next count includes their claims.

Invariant: the functions here are pure; what is wanted is never negative and never more than the steps left
could train on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from rollnet.node.p2p.envelopes import Demand


def horizon_groups(prompts_per_step: int, max_staleness: int, lag: int, steps_left: int | None) -> int:
    """H: the groups a batch generated `lag` versions behind the trainer can still be trained in (see the module)."""
    steps = max(0, max_staleness + 1 - max(0, lag))
    if steps_left is not None:
        steps = min(steps, max(0, steps_left))
    return steps * prompts_per_step


def leases_wanted(demand: Demand, tasks_per_lease: int, max_staleness: int, chain_version: int) -> int:
    """wanted = ceil((H - S) / tasks_per_lease), at least 0, for batches generated with `chain_version`."""
    horizon = horizon_groups(demand.prompts_per_step, max_staleness, demand.version - chain_version,
                             demand.steps_left)
    return max(0, math.ceil((horizon - demand.supply_groups) / tasks_per_lease))


def unclaimed(demand: Demand, tasks_per_lease: int, max_staleness: int, chain_version: int, lease_count: int) -> int:
    """What a worker may still claim of `demand` once the job has `lease_count` leases: what is wanted, less the
    claims mined since the trainer counted (never negative)."""
    wanted = leases_wanted(demand, tasks_per_lease, max_staleness, chain_version)
    return max(0, wanted - max(0, lease_count - demand.claims_seen))


@dataclass(frozen=True)
class OpenLease:
    """A lease as the trainer's demand sees it: claimed (not yet submitted) or submitted and not yet judged."""
    lease_id: int
    submitted: bool
    policy_version: int  # the chain's version at the claim, then the batch's version
    since: int | None  # chain seconds at its claim, or when it was seen submitted (None: unknown, counted)
    decided_against: bool = False  # its round was decided reject or void: refused unless an appeal reverses it


def in_flight(leases: Iterable[OpenLease], version: int, max_staleness: int, now: int, presumed_lost_s: float,
              vote_window_s: int) -> int:
    """The leases that may still bring trainable batches: fresh enough, and neither claimed nor submitted longer
    ago than a live worker and committee would take (see the module)."""
    count = 0
    for lease in leases:
        if version - lease.policy_version > max_staleness:
            continue  # it would arrive too stale
        if lease.decided_against:
            continue  # the committee refused it: the trainer refuses it once its appeal window passes
        limit = presumed_lost_s + (vote_window_s if lease.submitted else 0)
        if lease.since is not None and now - lease.since > limit:
            continue  # late: presumed lost until it shows up
        count += 1
    return count


def presumed_lost_after(claim_to_submit_s: float | None, lease_duration: int) -> float:
    """Seconds after its claim that an unsubmitted lease stops counting: twice the measured claim-to-submission
    time (at least 10 s), or the whole lease before any was measured."""
    if claim_to_submit_s is None:
        return float(lease_duration)
    return min(float(lease_duration), max(10.0, 2 * claim_to_submit_s))
