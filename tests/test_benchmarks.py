"""Every benchmark runs in its quick mode and writes the JSON it promises (numbers are not asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, needs_real, needs_vllm


def run_bench(script: str, tmp_path: Path, env: dict[str, str] | None = None, extra: tuple[str, ...] = (),
              timeout: float = 300) -> dict:
    out = tmp_path / f"{script}.json"
    result = subprocess.run([sys.executable, str(REPO / "bench" / f"{script}.py"), "--quick", "--json", str(out),
                             *extra],
                            capture_output=True, text=True, timeout=timeout, cwd=REPO,
                            env={**os.environ, **(env or {})})
    assert result.returncode == 0, result.stderr
    assert "wrote" in result.stdout
    return json.loads(out.read_text())


def test_delta_benchmark_quick(tmp_path: Path) -> None:
    report = run_bench("delta", tmp_path)
    assert report["encode_gbps"] > 0 and report["apply_gbps"] > 0
    names = [row["name"] for row in report["inputs"]]
    assert any(name.startswith("grpo-") for name in names) and any(name.startswith("synthetic-") for name in names)
    for row in report["inputs"]:
        assert {"change_fraction", "ratio_ours", "ratio_naive_sparse", "ratio_entropy_bound"} <= set(row)
        assert 0 < row["change_fraction"] < 1
        assert row["ratio_ours"] > row["ratio_naive_sparse"]  # the codec beats naive sparse everywhere
        if row["name"].startswith("synthetic-"):  # i.i.d. changes: the order-0 bound is a true bound there
            assert row["ratio_ours"] <= row["ratio_entropy_bound"] * 1.0001


def test_cli_startup_benchmark_quick(tmp_path: Path) -> None:
    report = run_bench("cli_startup", tmp_path)
    (row,) = report["rows"]
    assert row["command"] == "keys new" and row["lazy_s"] > 0 and row["eager_s"] > 0
    assert row["eager_over_lazy"] == pytest.approx(row["eager_s"] / row["lazy_s"])


def test_gas_benchmark_quick(tmp_path: Path) -> None:
    report = run_bench("gas", tmp_path)
    rows = report["rows"]
    assert [row["tasks_per_lease"] for row in rows] == [1, 8]
    assert rows[1]["gas_per_accepted_sample"] < rows[0]["gas_per_accepted_sample"]


def test_broadcast_benchmark_quick(tmp_path: Path) -> None:
    report = run_bench("broadcast", tmp_path)
    assert [run["n"] for run in report["runs"]] == [2, 4]
    for run in report["runs"]:
        assert run["star_s"] > 0 and run["swarm_s"] > 0 and run["bound_s"] > 0
    assert report["single_transfer_mb_s"] > 0 and report["raw_tcp_mb_s"] > 0


def test_toploc_benchmark_quick(tmp_path: Path, model_home: Path) -> None:
    report = run_bench("toploc", tmp_path, {"ROLLNET_HOME": str(model_home)})
    rows = {row["case"]: row for row in report["rows"]}
    assert len(rows) == 11 and "honest (padded batch, mixed prompt lengths)" in rows
    for row in rows.values():
        assert row["trials"] >= 16
        assert row["detected"] == (0 if row["honest"] else row["trials"]), row
    assert report["proof_bytes_per_token"] > 0 and report["verify_speedup"] > 0
    realistic = report["realistic"]  # SmolLM2 costs need the `real` extra; without it, a stated skip
    assert realistic.get("rows") or "rollnet[real]" in realistic["skipped"]
    for row in realistic.get("rows", []):
        assert row["overhead_fraction"] > 0 and row["verify_speedup"] > 0


@needs_vllm
def test_toploc_benchmark_with_vllm_rollouts_quick(tmp_path: Path, model_home: Path) -> None:
    """Cross-engine: vLLM generates, the transformers prefill verifies; honest passes, every cheat fails."""
    report = run_bench("toploc", tmp_path, {"ROLLNET_HOME": str(model_home)}, ("--backend", "vllm"))
    rows = {row["case"]: row for row in report["rows"]}
    assert report["backend"] == "vllm" and len(rows) == 9
    for row in rows.values():
        assert row["trials"] >= 16
        assert row["detected"] == (0 if row["honest"] else row["trials"]), row


@needs_vllm
def test_generate_benchmark_quick(tmp_path: Path, model_home: Path) -> None:
    report = run_bench("generate", tmp_path, {"ROLLNET_HOME": str(model_home)}, ("--tiny",))
    assert [row["batch"] for row in report["throughput"]] == [1, 8, 64]
    for row in report["throughput"]:
        assert row["vllm_tokens_per_s"] > 0 and row["transformers_tokens_per_s"] > 0
    assert report["cross_engine"]["flagged_cpu_thresholds"] == 0  # vLLM's honest rollouts pass the validator
    update = report["update"]
    assert update["delta_bytes_median"] > 0
    assert update["delta_apply_and_root_check_s"] > 0 and update["full_reload_s"] > 0


def test_rollout_benchmark_quick(tmp_path: Path, model_home: Path) -> None:
    report = run_bench("rollout", tmp_path, {"ROLLNET_HOME": str(model_home)})
    assert [row["batch"] for row in report["rows"]] == [1, 8, 64]
    for row in report["rows"]:
        assert row["ours_tokens_per_s"] > 0 and row["generate_tokens_per_s"] > 0


def test_async_ablation_benchmark_shortened(tmp_path: Path, model_home: Path) -> None:
    report = run_bench("async_ablation", tmp_path, {"ROLLNET_HOME": str(model_home)}, ("--steps", "4", "--seeds", "2"))
    arms = {arm["name"]: arm for arm in report["arms"]}
    assert [arm["staleness"] for arm in report["arms"]] == [0, 2, 4, 4]
    assert arms["staleness 4, δ off"]["delta"] is None and arms["staleness 4, δ=4"]["delta"] == 4.0
    for arm in report["arms"]:
        assert {"final_reward_mean", "final_reward_std", "reward_curve"} <= set(arm)
        assert arm["reward_curve"]["steps"][-1] == 4
        assert max(int(g) for g in arm["realised_staleness"]) == min(arm["staleness"], 3)  # v samples from v - lag
    assert (tmp_path / "async_ablation.png").stat().st_size > 1000


def test_async_throughput_benchmark_quick(tmp_path: Path, model_home: Path) -> None:
    report = run_bench("async_throughput", tmp_path, {"ROLLNET_HOME": str(model_home)})
    sync, overlapped = report["arms"]
    assert set(sync["staleness"]) == {"0"} and max(int(g) for g in overlapped["staleness"]) <= 4
    assert sync["samples_per_s"] > 0 and overlapped["samples_per_s"] > 0 and report["speedup"] > 0


def test_sampled_verification_benchmark_quick(tmp_path: Path, model_home: Path) -> None:
    report = run_bench("sampled_verify", tmp_path, {"ROLLNET_HOME": str(model_home)})
    rows = {row["f"]: row for row in report["rows"]}
    assert [rows[f]["samples_per_member"] for f in ("1/32", "1/8", "1")] == [2, 8, 64]  # of a 64-rollout lease
    assert rows["1"]["vs_full"] == 1 and all(row["fraction_of_generation"] > 0 for row in rows.values())
    for row in report["catch"]:  # the rule never promises more than sampling delivers (without replacement)
        assert row["rule"] <= row["exact"] + 1e-12 and 0 <= row["caught_rate"] <= 1


def test_efficiency_benchmark_runs_the_three_arms(tmp_path: Path, model_home: Path) -> None:
    """(a) sync, (b) async local and (c) the whole market on 2 steps; numbers are not asserted, their shape is."""
    report = run_bench("efficiency", tmp_path, {"ROLLNET_HOME": str(model_home)},
                       extra=("--steps", "2", "--out", str(tmp_path / "market")), timeout=900)
    assert [run["arm"] for run in report["runs"]] == ["sync", "async_local", "market"]
    assert all(run["samples_per_s"] > 0 and run["block_time_s"] == 0 for run in report["runs"])
    market, local = report["runs"][2]["samples_per_s"], report["runs"][1]["samples_per_s"]
    assert report["efficiency"]["embedded"] == pytest.approx(market / local)
    assert report["latency"]["total"] > 0 and "verification" in report["latency"]
    assert 0 < report["verification_fraction"]["embedded"]
    # The trainer's demand: the workers generate the 2 steps' 8 leases, and at most one more each for a race.
    row = report["runs"][2]
    assert row["trained_samples"] == 2 * 256 <= row["submitted_samples"] <= 2 * 256 + 3 * 64
    # The latency's ceilings: the budget (4) allows 5 steps of 32 x 8 samples per lease latency from generation on;
    # the 3 workers' windows (each starting at 4 leases) hold leases of 8 x 8 samples in flight for a whole latency.
    latency, ceilings = report["latency"], report["ceilings"]["embedded"]
    from_generation = latency["total"] - latency["claim"] - latency["seed wait"]
    assert ceilings["staleness"]["samples_per_s"] == pytest.approx(5 * 256 / from_generation, rel=1e-3)
    assert 3 <= ceilings["window_leases"] <= 3 * 16
    assert ceilings["in_flight"]["samples_per_s"] == pytest.approx(round(ceilings["window_leases"] * 64)
                                                                   / latency["total"], rel=1e-3)
    assert ceilings["in_flight"]["against_async_local"] == pytest.approx(ceilings["in_flight"]["samples_per_s"]
                                                                         / local)


def test_scale_benchmark_settles_every_lease_and_reports_each_measure(tmp_path: Path) -> None:
    """One small row (4 workers, 3 validators) against the real contracts: every lease is settled and paid, each
    measure the issue names is in the JSON, and every first round had its committee (numbers are not asserted).
    Two of the workers carry real rollouts: every member drawn for their leases fetched the batch over libp2p
    and judged it with the model, and both were paid."""
    report = run_bench("scale", tmp_path, extra=("--rows", "4x3", "--processes", "2", "--real-every", "2",
                                                      "--skip-appeal-windows"),
                       timeout=600)
    (row,) = report["rows"]
    assert (row["workers"], row["validators"], row["leases"], row["accepted_leases"]) == (4, 3, 4, 4)
    assert {"rpc_calls_per_lease", "gas_per_accepted_sample", "verifications_per_validator_per_lease"} <= set(row)
    assert row["gas_per_accepted_sample"] == pytest.approx(sum(row["gas_per_accepted_sample_by_function"].values()),
                                                           rel=0.01)  # the participants' counts, the chain's scan
    assert not any("reverted" in name for name in row["gas_per_accepted_sample_by_function"])  # keepers took turns
    assert row["verifications_per_lease"] >= 1 and row["admission_latency_s"]["median"] > 0
    assert 0 < row["appeal_windows_skipped_s"] <= 61  # the decided leases' appeal windows (60 s), nothing more
    assert set(row["rpc_calls_per_participant_per_s"]) == {"workers", "validators"}
    real = row["real"]
    assert (real["leases"], real["paid"], real["unpaid"]) == (2, 2, 0)
    # with equal stakes every validator sits on every first round: 3 members judged each real batch, all accepted
    assert (real["verdicts"], real["accepted_verdicts"], real["rejections"]) == (6, 6, [])
    assert real["fetched_bytes_median"] > 10_000 and real["audited_rollouts_median"] >= 1


@needs_real
def test_real_model_benchmark_quick(tmp_path: Path, model_home: Path) -> None:
    """SmolLM2 end to end in one quick run: sampled reward per candidate task (chat template, EOS, answer
    rules), real GRPO deltas decoded bit for bit against the baselines, honest and cheating rollouts through
    the validator's checks, and costs (numbers not asserted)."""
    # the timeout bounds a hung run, it is no speed check: a loaded 2-core machine took over 900 s
    report = run_bench("real_model", tmp_path, {"ROLLNET_HOME": str(model_home)}, timeout=1800)
    rows = report["task_choice"]
    assert [row["task"] for row in rows] == ["gym:gcd:last-number", "gym:basic_arithmetic"]
    for row in rows:
        assert row["samples"] == 8 and 0 <= row["mean_reward"] <= 1
        assert 0 < row["mean_tokens"] <= row["max_tokens"] <= 48
    assert report["chosen_task"] in {None, *(row["task"] for row in rows)}
    for row in report["delta"]:
        assert row["bit_exact"] is True and 0 < row["change_fraction"] < 1
        assert row["ratio_ours"] > 1 and row["ratio_pulse_style"] > 1 and row["ratio_entropy_bound"] > 1
    honest = report["honest"]
    assert honest["rollouts"] > 0 and honest["flagged"] == 0
    assert report["detection"] and all(row["trials"] > 0 and 0 <= row["flagged"] <= row["trials"]
                                       for row in report["detection"])
    assert {row["batch"] for row in report["cost"]} and all(row["generate_s"] > 0 for row in report["cost"])
