"""The devnet's end-of-run report: `report.json` (every number), `report.md` (the summary) and PNG plots.

Invariants: the report is drawn only from `report.json`'s data, which comes from the participants' event
logs and the chain (`observe.RunState`, `gas_by_call`); the staleness prediction uses the run's own
measured numbers (parameters, delta size and change fraction, measured transfer rate, step time) through
the same model as `rollnet budget`, shown beside the realised staleness, with the pipeline latency that
the broadcast-only prediction leaves out.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from rollnet.devnet.latency import (  # noqa: E402
    CRITICAL_PATH,
    cpu_by_role,
    lease_latency,
    throughput_ceilings,
    trained_samples_per_s,
    verification_fraction,
    window_leases,
)
from rollnet.devnet.observe import RunState  # noqa: E402
from rollnet.node.budget import predict  # noqa: E402

PLOTS = ("reward.png", "staleness.png", "delta.png", "gas.png", "payments.png")
WEI = 10**18


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def build_report(state: RunState, *, params: int, budget: int, gas: dict[str, dict], run: dict) -> dict:
    steps = state.steps()
    held = state.held_out()
    histogram = state.staleness_histogram()
    trained = sum(histogram.values())
    broadcasts = state.broadcasts()
    deltas = [s["delta_bytes"] for s in steps if s["delta_bytes"]]
    changes = [s["changed_fraction"] for s in steps if s.get("changed_fraction")]
    rates = [8 * b["delta_bytes"] / b["fetch_s"] for b in broadcasts if b["fetch_s"] > 0]
    intervals = [s["interval_s"] for s in steps[1:]]
    step_s = _mean(intervals) or _mean([s["interval_s"] for s in steps])
    submits = [e for p in state.people.values() for e in p.of("submit")]
    admissions = {e["lease"]: e for e in state.trainer.of("admission")}
    submit_at = {e["lease"]: e["t"] for e in submits}
    validation = [admissions[lease]["t"] - t for lease, t in submit_at.items() if lease in admissions]
    link_bps = statistics.median(rates) if rates else 1e9
    prediction = predict(params, link_bps, sparse=True, change=_mean(changes) or 0.01, step_s=step_s or 1.0,
                         budget=budget)
    generation = _mean([e["seconds"] for e in submits])
    pipeline_g = (prediction.broadcast_s + generation + _mean(validation)) / (step_s or 1.0)
    accepted_samples = sum(e["rollouts"] for p in state.people.values() for e in p.of("submit")
                           if admissions.get(e["lease"], {}).get("admitted"))
    market_gas = sum(v["gas"] for v in gas.values() if not v["setup"])
    chain = state.chain
    consumed = sum(s["groups"] for s in steps) * run.get("group_size", 8)
    groups_consumed = sum(s["groups"] for s in steps)
    without_signal = sum(s.get("groups_without_signal", 0) for s in steps)
    latency = lease_latency(state)
    report = {
        "run": run,
        "steps": len(steps),
        # the share of trained groups whose rewards had spread (a group of equal rewards teaches nothing)
        "signal_fraction": (groups_consumed - without_signal) / groups_consumed if groups_consumed else 0.0,
        "samples": {"accepted": sum(e["rollouts"] for p in state.people.values() for e in p.of("submit")
                                    if admissions.get(e["lease"], {}).get("admitted")),
                    "consumed_by_training": consumed, "trained_with_signal": trained,
                    # every batch submitted, trained on or not: what the workers generated (and the requester may
                    # have paid for) beyond the consumed samples was never trained on
                    "submitted": sum(e["rollouts"] for p in state.people.values() for e in p.of("submit"))},
        "held_out": {"base": held[0]["accuracy"] if held else None, "final": held[-1]["accuracy"] if held else None,
                     "by_version": {h["version"]: h["accuracy"] for h in held}},
        "reward_by_version": {s["version"]: s["reward"] for s in steps},
        "staleness": {
            "budget": budget, "histogram": {str(g): n for g, n in sorted(histogram.items())},
            "mean_g": sum(g * n for g, n in histogram.items()) / trained if trained else 0.0,
            "max_g": max(histogram) if histogram else 0,
            "by_worker": {w: {str(g): n for g, n in sorted(c.items())} for w, c in state.staleness_by_worker().items()},
        },
        "deltas": {"full_bf16_bytes": 2 * params, "bytes_by_version": {s["version"]: s["delta_bytes"] for s in steps},
                   "mean_bytes": _mean(deltas), "mean_changed_fraction": _mean(changes),
                   "mean_broadcast_s": _mean([b["broadcast_s"] for b in broadcasts]),
                   "mean_fetch_s": _mean([b["fetch_s"] for b in broadcasts]), "median_link_bps": link_bps},
        "prediction": {
            "params": params, "link_bps": link_bps, "change": prediction.change,
            "payload_bytes": prediction.payload_bytes,
            "broadcast_s": prediction.broadcast_s, "step_s": step_s, "g_broadcast": prediction.staleness,
            "generation_s": generation, "validation_s": _mean(validation), "g_pipeline": pipeline_g,
            "fits_budget": prediction.fits,
        },
        "gas": {"by_call": gas, "market_gas": market_gas, "accepted_samples": accepted_samples,
                "gas_per_accepted_sample": market_gas / accepted_samples if accepted_samples else None},
        "money": {
            "decided": dict(chain.decided),
            "earned_wei": {n: chain.owed.get(n, 0) + chain.withdrawn.get(n, 0) for n in state.people},
            "paid_wei": chain.settled_paid, "slashed_wei": chain.slashed, "stake_wei": chain.stake,
        },
        "committees": {
            "leases_voted": len(chain.committees),
            "round_decisions": dict(chain.rounds),
            "appeals": chain.appeals,
            "mean_members_voting": _mean([len(votes) for votes in chain.committees.values()]),
            "by_lease": {str(lease): votes for lease, votes in sorted(chain.committees.items())},
        },
        "latency": latency,
        "throughput": {"trained_samples_per_s": trained_samples_per_s(state),
                       "verification_fraction": verification_fraction(state),
                       "ceilings": _ceilings(state, latency, run, budget)},
        "cpu": _cpu_shares(state, run),
        "verdicts": {p.name: {"accept": sum(v["accept"] for v in p.of("verdict")),
                              "reject": sum(not v["accept"] for v in p.of("verdict")),
                              "reasons": sorted({v["reason"] for v in p.of("verdict") if not v["accept"]})}
                     for p in state.people.values() if p.role == "validator"},
    }
    return report


def _ceilings(state: RunState, latency: dict[str, float], run: dict, budget: int) -> dict[str, float]:
    """The run's throughput ceilings from its lease latency (`latency.throughput_ceilings`), and the leases the
    workers' windows allowed in flight (a window starts at the budget, at least 1, unless fixed)."""
    group = run.get("group_size", 8)
    leases = window_leases(state, run.get("max_undecided") or max(1, budget))
    ceilings = throughput_ceilings(latency, budget=budget, samples_per_step=run.get("prompts_per_step", 32) * group,
                                   samples_in_flight=round(leases * run.get("tasks_per_lease", 8) * group))
    return {**ceilings, "window_leases": leases} if ceilings else {}


def _cpu_shares(state: RunState, run: dict) -> dict:
    """CPU seconds per role (the chain node and the orchestrator too) and each one's share of the machine's
    CPU time over the run (wall seconds x cores)."""
    others = {role: run[key] for role, key in (("chain", "chain_cpu_s"), ("orchestrator", "orchestrator_cpu_s"))
              if run.get(key) is not None}
    seconds = cpu_by_role(state, others)
    machine = run.get("seconds", 0.0) * (run.get("cores") or 1)
    return {"seconds": seconds, "share": {role: round(s / machine, 4) for role, s in seconds.items()} if machine
            else {}}


def write_report(report: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    paths = [_plot_reward(report, out / "reward.png"), _plot_staleness(report, out / "staleness.png"),
             _plot_deltas(report, out / "delta.png"), _plot_gas(report, out / "gas.png"),
             _plot_money(report, out / "payments.png")]
    (out / "report.md").write_text(markdown(report))
    return [out / "report.json", out / "report.md", *paths]


def _latency_lines(report: dict) -> list[str]:
    """The lease latency breakdown, the market's throughput and efficiency, and the CPU by role."""
    latency, cpu = report.get("latency", {}), report.get("cpu", {})
    rate = report.get("throughput", {}).get("trained_samples_per_s")
    lines = ["## Where a lease's time goes", "",
             "Median seconds per stage over the admitted leases, from the participants' event logs "
             "(`rollnet/devnet/latency.py` defines each stage); fetch and verification are inside "
             "\"committee done\", and the vote is off the trainer's critical path.", "",
             "| stage | seconds |", "|---|---:|",
             *[f"| {stage} | {latency[stage]:.3f} |" for stage in (*CRITICAL_PATH, "fetch", "verification", "vote")
               if latency.get(stage) is not None],
             f"| **total (critical path)** | **{latency.get('total', 0.0):.3f}** |", ""]
    if rate is not None:
        efficiency = report.get("efficiency")
        lines += [f"The market trained {rate:.1f} samples/s (from the trainer's first admission to its last step)"
                  + (f"; efficiency against the local asynchronous pipeline on the same batch: {efficiency:.3f}"
                     if efficiency is not None else "") + ".", ""]
    ceilings = report.get("throughput", {}).get("ceilings") or {}
    if ceilings:
        lines += [f"At this latency no market trains more than {ceilings['staleness']:.1f} samples/s within the "
                  f"staleness budget, nor more than {ceilings['in_flight']:.1f} with the leases its workers may hold "
                  "in flight (`latency.throughput_ceilings`).", ""]
    fraction = report.get("throughput", {}).get("verification_fraction")
    if fraction is not None:
        lines += [f"Verification cost {fraction:.1%} of generation's compute on the admitted leases (the members' "
                  "verify seconds over the workers' generation seconds).", ""]
    if cpu.get("seconds"):
        lines += ["| role | CPU s | share of the machine |", "|---|---:|---:|",
                  *[f"| {role} | {seconds:.1f} | {cpu['share'].get(role, 0.0):.1%} |"
                    for role, seconds in sorted(cpu["seconds"].items(), key=lambda item: -item[1])]]
    return lines


# ---------------------------------------------------------------------- plots


def _save(figure: plt.Figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _finish(figure: plt.Figure, axis: plt.Axes, path: Path, xlabel: str, ylabel: str, title: str) -> Path:
    """Label, add the legend and save: the last step every line plot shares."""
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.set_title(title)
    axis.legend()
    return _save(figure, path)


def _plot_reward(report: dict, path: Path) -> Path:
    figure, axis = plt.subplots(figsize=(7, 4))
    rewards = report["reward_by_version"]
    axis.plot([int(v) for v in rewards], list(rewards.values()), label="sampled reward (trained batch)", alpha=0.7)
    held = report["held_out"]["by_version"]
    axis.plot([int(v) for v in held], list(held.values()), "o-", label="held-out greedy accuracy")
    return _finish(figure, axis, path, "policy version (training step)", "reward / accuracy", "reward versus step")


def _plot_staleness(report: dict, path: Path) -> Path:
    figure, axis = plt.subplots(figsize=(7, 4))
    staleness = report["staleness"]
    by_worker = staleness["by_worker"]
    bottom: dict[int, int] = {}
    for worker, histogram in sorted(by_worker.items()):
        xs = [int(g) for g in histogram]
        axis.bar(xs, list(histogram.values()), bottom=[bottom.get(x, 0) for x in xs], label=worker)
        for x, n in zip(xs, histogram.values(), strict=True):
            bottom[x] = bottom.get(x, 0) + n
    axis.axvline(staleness["budget"] + 0.5, color="red", linestyle="--", label=f"budget ({staleness['budget']})")
    prediction = report["prediction"]
    axis.axvline(prediction["g_pipeline"], color="black", linestyle=":", label="predicted g (pipeline)")
    return _finish(figure, axis, path, "realised staleness g (versions)", "samples trained on",
                   "staleness of trained samples against the budget")


def _plot_deltas(report: dict, path: Path) -> Path:
    figure, axis = plt.subplots(figsize=(7, 4))
    deltas = {int(v): b for v, b in report["deltas"]["bytes_by_version"].items() if b}
    axis.plot(list(deltas), list(deltas.values()), "o-", label="sparse delta")
    axis.axhline(report["deltas"]["full_bf16_bytes"], color="red", linestyle="--", label="full bf16 weights")
    axis.set_yscale("log")
    return _finish(figure, axis, path, "policy version", "bytes broadcast",
                   "delta size per version against full weights")


def _plot_gas(report: dict, path: Path) -> Path:
    figure, axis = plt.subplots(figsize=(7, 4))
    calls = {n: v for n, v in sorted(report["gas"]["by_call"].items()) if not v["setup"]}
    axis.bar(list(calls), [v["gas"] for v in calls.values()])
    per_sample = report["gas"]["gas_per_accepted_sample"]
    axis.set_title(f"market gas by call; {per_sample:,.0f} gas per accepted sample" if per_sample else "market gas")
    axis.set_ylabel("gas")
    axis.tick_params(axis="x", rotation=30)
    return _save(figure, path)


def _plot_money(report: dict, path: Path) -> Path:
    figure, axis = plt.subplots(figsize=(7, 4))
    money = report["money"]
    names = sorted(n for n in money["earned_wei"] if money["earned_wei"][n] or money["slashed_wei"].get(n))
    earned = [money["earned_wei"][n] / WEI for n in names]
    slashed = [-money["slashed_wei"].get(n, 0) / WEI for n in names]
    axis.bar(names, earned, color="green", label="earned (ETH)")
    axis.bar(names, slashed, color="red", label="slashed (ETH)")
    axis.axhline(0, color="black", linewidth=0.5)
    axis.set_title("payments and slashes")
    axis.legend()
    axis.tick_params(axis="x", rotation=30)
    return _save(figure, path)


# ---------------------------------------------------------------------- markdown


def _appeals(appeals: list[dict]) -> str:
    return ", ".join(f"lease {a['lease']} to round {a['round']} by {a['appellant']}" for a in appeals)


def markdown(report: dict) -> str:
    held, staleness, prediction = report["held_out"], report["staleness"], report["prediction"]
    deltas, gas, money, run = report["deltas"], report["gas"], report["money"], report["run"]
    samples = report["samples"]
    fixed = run.get("max_undecided")
    window_leases = report["throughput"].get("ceilings", {}).get("window_leases")
    windows = (f"at most {fixed} lease(s) in flight per worker" if fixed else "adaptive in-flight windows"
               + (f", {window_leases:.1f} leases in all on average" if window_leases is not None else ""))
    lines = [
        "# rollnet devnet report", "",
        f"{run['workers']} workers, {run['validators']} validators"
        + (f", a `{run['cheater']}` cheater" if run.get("cheater") else "")
        + f", {report['steps']} training steps in {run['seconds']:.0f} s (staleness budget {staleness['budget']}, "
        f"lr {run.get('lr', '-')}, {windows}).", "",
        "| measure | value |", "|---|---|",
        f"| held-out greedy accuracy | {held['base']:.3f} (base) → {held['final']:.3f} (final) |"
        if held["base"] is not None else "| held-out greedy accuracy | - |",
        f"| realised staleness g | mean {staleness['mean_g']:.2f}, max {staleness['max_g']} |",
        f"| trained groups with reward spread (signal) | {report['signal_fraction']:.0%} |",
        f"| samples submitted / trained on | {samples['submitted']:,} / {samples['consumed_by_training']:,} |",
        f"| delta per version | {deltas['mean_bytes']:,.0f} B mean vs {deltas['full_bf16_bytes']:,} B full bf16 "
        f"({deltas['full_bf16_bytes'] / max(1.0, deltas['mean_bytes']):.0f}× smaller) |",
        f"| broadcast (announce → applied) | {deltas['mean_broadcast_s']:.3f} s mean |",
        f"| gas per accepted sample | {gas['gas_per_accepted_sample']:,.0f} ({gas['market_gas']:,} gas for "
        f"{gas['accepted_samples']} samples) |" if gas["gas_per_accepted_sample"]
        else "| gas per accepted sample | - |",
        f"| batches settled | {money['decided'].get('accepted', 0)} accepted, {money['decided'].get('rejected', 0)} "
        f"rejected, {money['decided'].get('void', 0)} void |",
        f"| committees | {report['committees']['leases_voted']} leases voted on, "
        f"{report['committees']['mean_members_voting']:.1f} votes per lease, "
        f"{len(report['committees']['appeals'])} appeals |",
        *([f"| final policy | version {run['final_policy']['version']} (root "
           f"`{run['final_policy']['root'][:16]}…`, the chain's): `{run['final_policy']['folder']}` |"]
          if run.get("final_policy", {}).get("folder") else []), "",
        "## Staleness: prediction against the run", "",
        f"`rollnet budget` on this run's numbers: {prediction['params']:,} parameters, a measured change fraction "
        f"of {prediction['change']:.4f}, a measured loopback transfer rate of {prediction['link_bps'] / 1e6:,.0f} "
        f"Mbit/s and a mean step time S = {prediction['step_s']:.2f} s predict a broadcast time "
        f"B = {prediction['broadcast_s'] * 1000:.2f} ms, so g = B/S = {prediction['g_broadcast']:.4f}: "
        "the broadcast tax is negligible at this model size. The realised g is set by the rest of the pipeline: "
        f"generation ({prediction['generation_s']:.2f} s per lease) and validation until admission "
        f"({prediction['validation_s']:.2f} s): (B + generation + validation)/S = {prediction['g_pipeline']:.2f}, "
        f"against the realised mean g = {staleness['mean_g']:.2f} (samples also wait in the buffer for a full "
        "batch). The transfer rate is that of one delta fetch on loopback, round trips included.", "",
        "| g | samples |", "|---|---|",
        *[f"| {g} | {n} |" for g, n in staleness["histogram"].items()], "",
        *_latency_lines(report), "",
        "## Money", "",
        "| participant | earned | slashed | stake now |", "|---|---|---|---|",
        *[f"| {n} | {money['earned_wei'].get(n, 0) / WEI:.4f} ETH | {money['slashed_wei'].get(n, 0) / WEI:.4f} ETH | "
          f"{money['stake_wei'].get(n, 0) / WEI:.4f} ETH |" for n in sorted(money["stake_wei"])], "",
        "## Committees", "",
        "Each batch is judged by a committee drawn after its submission from the hash of the submission block, "
        "weighted by the validators' stake at the block before; a round is decided as soon as votes holding more "
        "than half of the validator stake agree, else at its vote deadline. Votes per lease (round: validator "
        "accept/reject, share of the round's total weight), first 12 leases:", "",
        "| lease | votes |", "|---|---|",
        *[f"| {lease} | " + ", ".join(f"r{v['round']} {v['validator']} {'A' if v['accept'] else 'R'}"
                                     + (f" ({v['share']:.0%})" if v["share"] is not None else "") for v in votes)
          + " |" for lease, votes in list(report["committees"]["by_lease"].items())[:12]], "",
        *([f"Appeals: {_appeals(report['committees']['appeals'])}.", ""] if report["committees"]["appeals"] else []),
        "## Verdicts", "",
        *[f"- {name}: {v['accept']} accepted, {v['reject']} rejected" + (f" ({'; '.join(v['reasons'])})"
                                                                         if v["reasons"] else "")
          for name, v in report["verdicts"].items()], "",
        "## Plots", "",
        *[f"![{name}]({name})" for name in PLOTS], "",
    ]
    return "\n".join(lines)
