"""Where a lease's time goes, what the market trains per second, and which role spends the CPU: all from the
participants' own event logs (`observe.RunState`).

A lease's stages, in order along its critical path (each the median over the round-0 leases the trainer
admitted; seconds):
- claim, seed wait: the worker's claim transaction, then waiting for the claim block's hash and drawing the
  prompt seed (the `submit` event's `claim_s`, `seed_wait_s`);
- generation + proofs, sign + store, submit: the worker's `generate_s` (TOPLOC proofs are computed inside
  generation), `store_s` (signing, storing for peers, and any configured delay) and the submit transaction's
  `submit_s`;
- seen by validators: from the worker's `submit` event to the first validator's `drawn` event (following the
  chain, then asking the contract whether it sits on the committee);
- fetch, verification: the members' mean `fetch_s` and `verify_s` (their `verdict` events);
- committee done: from the first `drawn` to the last member's `verdict` (members work in parallel: this is the
  committee's wall time, fetch and verification included);
- verdict gossip + admission: from the last verdict to the trainer's `admission` (the trainer admits on the
  signed verdicts' gossip, before any vote is mined);
- wait in buffer: from admission to the start of the training step that took the batch's groups (the next
  `step` event's time less its `train_s` and `publish_s`);
- vote: from a member's verdict to its `attest` (vote transaction) event; off the critical path, shown apart.

`total` sums the critical path: claim through wait in buffer, without fetch and verification (inside
"committee done") and without vote.

Two ceilings follow from that latency, whatever the machine's speed (`throughput_ceilings`):
- staleness: a batch is generated with the newest version its worker holds (after its claim and seed wait) and
  must be trained before the trainer has published more than `budget` versions since. A trainer finishing a step
  every S seconds finishes about L/S steps during the L seconds from generation to training, so L/S < budget + 1,
  and trained samples/s < (budget + 1) x samples per step / L;
- in flight: the workers hold at most their in-flight windows' leases x samples per lease at once, each for a
  whole latency from claim to training, so trained samples/s <= that / total. A window's size over the run is
  its time-weighted mean (`window_leases`) from the worker's `window` events.

Invariants: pure functions of the events; a stage with no measurement in the run is absent rather than zero;
CPU seconds per role come from each process's own `cpu` field (its process time at its last event), so a
role's CPU is what its processes reported, not an estimate.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from rollnet.devnet.observe import RunState

CRITICAL_PATH = ("claim", "seed wait", "generation + proofs", "sign + store", "submit", "seen by validators",
                 "committee done", "verdict gossip + admission", "wait in buffer")
INSIDE = ("fetch", "verification")  # parts of "committee done"
OFF_PATH = ("vote",)
WORKER_STAGES = {"claim": "claim_s", "seed wait": "seed_wait_s", "generation + proofs": "generate_s",
                 "sign + store": "store_s", "submit": "submit_s"}


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def lease_latency(state: RunState) -> dict[str, float]:
    """Median seconds per stage over the round-0 leases the trainer admitted, and `total` (see the module)."""
    submits = {e["lease"]: e for p in state.people.values() if p.role in ("worker", "cheater") for e in p.of("submit")}
    admissions = {e["lease"]: e for e in state.trainer.of("admission") if e.get("admitted")}
    steps = sorted(state.trainer.of("step"), key=lambda e: e["t"])
    drawn: dict[int, list[float]] = defaultdict(list)
    verdicts: dict[int, list[dict]] = defaultdict(list)
    votes: list[float] = []
    for person in state.people.values():
        if person.role != "validator":
            continue
        mine = {}
        for event in person.of("drawn"):
            if event.get("round", 0) == 0:
                drawn[event["lease"]].append(event["t"])
        for event in person.of("verdict"):
            if event.get("round", 0) == 0:
                verdicts[event["lease"]].append(event)
                mine[event["lease"]] = event["t"]
        for event in person.of("attest"):
            votes += [event["t"] - mine[lease] for lease in event["leases"] if lease in mine]
    stages: dict[str, list[float]] = defaultdict(list)
    for lease, admission in admissions.items():
        submit = submits.get(lease)
        if submit is None or not drawn.get(lease) or not verdicts.get(lease):
            continue
        for stage, field in WORKER_STAGES.items():
            if field in submit:
                stages[stage].append(submit[field])
        seen = min(drawn[lease])
        last_verdict = max(v["t"] for v in verdicts[lease])
        stages["seen by validators"].append(seen - submit["t"])
        stages["committee done"].append(last_verdict - seen)
        for stage, field in (("fetch", "fetch_s"), ("verification", "verify_s")):
            measured = [v[field] for v in verdicts[lease] if field in v]
            if measured:
                stages[stage].append(statistics.fmean(measured))
        stages["verdict gossip + admission"].append(admission["t"] - last_verdict)
        taken = next((s for s in steps if s["t"] >= admission["t"]), None)
        if taken is not None:
            started = taken["t"] - taken.get("train_s", 0.0) - taken.get("publish_s", 0.0)
            stages["wait in buffer"].append(max(0.0, started - admission["t"]))
    stages["vote"] = votes
    result = {stage: _median(stages[stage]) for stage in (*CRITICAL_PATH, *INSIDE, *OFF_PATH) if stages[stage]}
    result["total"] = round(sum(result.get(stage) or 0.0 for stage in CRITICAL_PATH), 4)
    return result


def window_leases(state: RunState, start: int) -> float:
    """The leases the workers' in-flight windows allowed at once, summed over the workers: each one's window size
    averaged over time from its first claim to its last submission, `start` until its first `window` event."""
    total = 0.0
    for person in state.people.values():
        if person.role != "worker":
            continue
        claims, submits = person.of("claim"), person.of("submit")
        if not claims or not submits:
            continue
        begin, end = claims[0]["t"], submits[-1]["t"]
        if end <= begin:
            total += start
            continue
        size, at, area = start, begin, 0.0
        for event in person.of("window"):
            moment = min(max(event["t"], begin), end)
            area += size * (moment - at)
            size, at = event["size"], moment
        area += size * (end - at)
        total += area / (end - begin)
    return round(total, 4)


def throughput_ceilings(latency: dict[str, float], *, budget: int, samples_per_step: int,
                        samples_in_flight: int) -> dict[str, float]:
    """The trained samples/s that no market with this per-lease latency (`lease_latency`) can reach, from the
    staleness budget and from the samples the workers may hold in flight (see the module); empty without a
    measured latency."""
    total = latency.get("total") or 0.0
    from_generation = total - (latency.get("claim") or 0.0) - (latency.get("seed wait") or 0.0)
    if total <= 0 or from_generation <= 0:
        return {}
    return {"staleness": round((budget + 1) * samples_per_step / from_generation, 4),
            "in_flight": round(samples_in_flight / total, 4)}


def trained_samples_per_s(state: RunState) -> float | None:
    """Samples trained per second from the trainer's first admission (its first data, as the local pipeline's
    clock starts at its first batch) to its last step. A sample counts once a step consumed its group, with or
    without signal (a group whose rewards are all equal cost the pipeline as much), as the local arms count."""
    steps = state.trainer.of("step")
    admissions = [e["t"] for e in state.trainer.of("admission") if e.get("admitted")]
    if not steps or not admissions:
        return None
    seconds = steps[-1]["t"] - min(admissions)
    return sum(s.get("consumed", s["samples"]) for s in steps) / seconds if seconds > 0 else None


def verification_fraction(state: RunState) -> float | None:
    """Verification compute per accepted sample over generation compute: the committee members' `verify_s`
    summed over the leases the trainer admitted, over the workers' `generate_s` for the same leases."""
    admitted = {e["lease"] for e in state.trainer.of("admission") if e.get("admitted")}
    generate = sum(e.get("generate_s", 0.0) for p in state.people.values() if p.role == "worker"
                   for e in p.of("submit") if e["lease"] in admitted)
    verify = sum(e.get("verify_s", 0.0) for p in state.people.values() if p.role == "validator"
                 for e in p.of("verdict") if e["lease"] in admitted)
    return round(verify / generate, 4) if generate else None


def cpu_by_role(state: RunState, others: dict[str, float] | None = None) -> dict[str, float]:
    """CPU seconds per role: the sum over its processes of the `cpu` field of each one's last event, plus
    `others` (processes that keep no event log: the chain node, the orchestrator)."""
    totals: dict[str, float] = defaultdict(float)
    for person in state.people.values():
        reported = [e["cpu"] for e in person.events if "cpu" in e]
        if reported:
            totals[person.role] += reported[-1]
    for role, seconds in (others or {}).items():
        totals[role] += seconds
    return {role: round(seconds, 3) for role, seconds in totals.items()}
