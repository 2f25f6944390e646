"""bench/gpu.sh carries only what a torch-and-transformers machine has, runs end to end (a tiny shape on this CPU),
and its verification is the validator's: honest fp32 rollouts pass with every statistic 0, and cheats are caught."""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from conftest import REPO

CARRIED = [REPO / "node" / "toploc.py", REPO / "node" / "rollout" / "sampler.py", REPO / "bench" / "gpu_rows.py"]
GPU_MACHINE_HAS = {"numpy", "torch", "transformers"}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_the_carried_modules_need_only_torch_transformers_and_each_other() -> None:
    carried_names = {path.stem for path in CARRIED}
    for path in CARRIED:
        foreign = imported_roots(path) - set(sys.stdlib_module_names) - GPU_MACHINE_HAS - carried_names
        assert not foreign, f"{path.name} imports {foreign}, which the GPU machine does not have"
    script = (REPO / "bench" / "gpu.sh").read_text()
    assert all(path.relative_to(REPO).as_posix() in script for path in CARRIED)


def run_script(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "PYTHONPATH": ""}
    return subprocess.run(["bash", str(REPO / "bench" / "gpu.sh"), *args], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=env)


def test_gpu_script_smoke_run_on_cpu_writes_every_row(tmp_path: Path) -> None:
    result = run_script(tmp_path, "--device", "cpu", "--shape", "tiny", "--dtype", "float32", "--batches", "1,4",
                        "--repeats", "1", "--new-tokens", "40", "--cross-batches", "1")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "gpu_rows.json").read_text())
    assert [row["batch"] for row in report["rows"]] == [1, 4]
    for row in report["rows"]:
        assert row["tokens_per_s"] > 0 and 0 < row["proof_fraction"] < 1 and row["verify_s"] > 0
    honest = report["honest"]
    assert honest["rollouts"] == 5 and honest["min_chunks"] == 2  # 40 tokens: a full chunk and a partial one
    # Same platform, fp32, decode against prefill: the validator's tight thresholds pass every honest rollout.
    assert honest["flagged_with_tight_thresholds"] == 0 and honest["flagged_with_public_thresholds"] == 0
    assert honest["max_exponent_mismatches"] == 0 and honest["max_mean_mantissa_diff"] == 0
    cross = report["cross_platform"]  # the batch-1 rollout checked again on the CPU in fp32: the same arithmetic
    assert cross["device"] == "cpu" and cross["rollouts"] == 1 and cross["flagged_with_tight_thresholds"] == 0
    assert "| batch | tokens/s |" in result.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_gpu_script_without_cuda_says_so_in_one_line(tmp_path: Path) -> None:
    result = run_script(tmp_path)
    assert result.returncode == 2
    assert "no CUDA device here" in result.stderr and "Traceback" not in result.stderr


@pytest.fixture
def gpu_rows() -> Iterator[ModuleType]:
    """bench/gpu_rows.py imported as gpu.sh runs it: toploc and sampler as top-level modules."""
    folders = [str(path.parent) for path in CARRIED]
    sys.path[:0] = folders
    try:
        yield importlib.import_module("gpu_rows")
    finally:
        del sys.path[:len(folders)]
        for name in ("gpu_rows", "toploc", "sampler"):
            sys.modules.pop(name, None)


def test_gpu_script_verification_catches_cheats(gpu_rows: ModuleType) -> None:
    model = gpu_rows.build_model("tiny", torch.float32, torch.device("cpu"))
    prompts = torch.randint(0, model.config.vocab_size, (4, 16), generator=torch.Generator().manual_seed(3))
    seeds, samples = [7, 8, 9, 10], [0, 0, 0, 0]
    made = gpu_rows.generate(model, prompts, seeds, samples, 40, 1.0)
    honest = gpu_rows.verify(model, prompts, made, seeds, samples, 1.0)["rows"]
    assert not any(gpu_rows.flagged(row, "cpu_thresholds_flag") for row in honest)

    swapped = dict(made, tokens=made["tokens"].clone())  # a worker that picks its own token at position 5
    swapped["tokens"][0, 5] = (swapped["tokens"][0, 5] + 1) % model.config.vocab_size
    assert gpu_rows.verify(model, prompts, swapped, seeds, samples, 1.0)["rows"][0]["sampler_flag"]

    other = gpu_rows.build_model("tiny", torch.float32, torch.device("cpu"))  # another model's tokens and proofs
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    forged = gpu_rows.generate(other, prompts, seeds, samples, 40, 1.0)
    rows = gpu_rows.verify(model, prompts, forged, seeds, samples, 1.0)["rows"]
    assert all(row["public_flag"] and row["cpu_thresholds_flag"] for row in rows)
