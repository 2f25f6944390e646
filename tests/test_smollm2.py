"""SmolLM2-135M-Instruct as a preset (`--model smollm2`, `model = "smollm2"` in a spec): converted once from
the `real` extra's GGUF into the data directory, with an identity pinned in `model.pinned` that every
machine's conversion reproduces, its own tokenizer, chat template and EOS set, and rollouts that stop at EOS
with a partial final TOPLOC chunk and verify. Runs where the extra is installed; `make test` installs it
and requires it (conftest.needs_real).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO, needs_real
from rollnet.node.errors import ConfigError
from rollnet.node.model.identity import model_eos_token_ids
from rollnet.node.model.loading import cached_model, load_policy, preset_of, resolve_model
from rollnet.node.model.pinned import PRESETS, SMOLLM2
from rollnet.node.rollout.generate import generate
from rollnet.node.rollout.verify import verify_rollouts
from rollnet.node.spec import check_workable, load_job_spec
from rollnet.node.tasks import load_task
from rollnet.node.tasks.templated import ChatTemplatedTask
from rollnet.node.toploc import CHUNK_TOKENS as CHUNK

from rollnet.cli import main

pytestmark = needs_real
PINNED = PRESETS[SMOLLM2]


@pytest.fixture(scope="module")
def smollm2(model_home: Path) -> Path:
    """The converted folder, in the session's model home (the TOPLOC benchmark test reuses it)."""
    return resolve_model(model_home, Path(SMOLLM2))


def test_the_smollm2_preset_has_the_pinned_identity(smollm2: Path, model_home: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    capsys.readouterr()
    assert main(["--data-dir", str(model_home), "model", "identity", SMOLLM2]) == 0
    out = capsys.readouterr().out
    assert f'model_root = "0x{PINNED.root}"' in out and f'model_files_hash = "0x{PINNED.files_hash}"' in out
    assert preset_of(Path(SMOLLM2)) == SMOLLM2 and preset_of(None, SMOLLM2) == SMOLLM2 and preset_of(None, "x") is None
    assert cached_model(model_home, None, "gym:basic_arithmetic", SMOLLM2) == smollm2  # a job naming the preset


def test_a_folder_named_like_the_preset_is_refused_as_ambiguous(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / SMOLLM2).mkdir()
    with pytest.raises(ConfigError, match="names both the smollm2 preset and a folder here"):
        preset_of(Path(SMOLLM2))
    assert preset_of(tmp_path / SMOLLM2) is None  # an absolute path is the folder


def test_a_spec_naming_smollm2_pins_its_identity_for_any_task(tmp_path: Path) -> None:
    text = (REPO / "examples" / "job.toml").read_text()
    edited = text.replace('model = "embedded"', f'model = "{SMOLLM2}"').replace('task = "addition-2digit"',
                                                                                 'task = "gym:basic_arithmetic"')
    assert edited != text
    path = tmp_path / "job.toml"
    path.write_text(edited)
    spec = load_job_spec(path)
    check_workable(spec, str(path))
    assert spec.root_of_version_zero().hex() == PINNED.root
    assert spec.files_hash_of_version_zero().hex() == PINNED.files_hash


def test_smollm2_rollouts_use_its_chat_template_stop_at_eos_and_verify(smollm2: Path) -> None:
    """Its own tokenizer and chat template; completions end at its EOS (<|im_end|>) with lengths that leave
    a partial final TOPLOC chunk, and the validator's prefill accepts every one."""
    model, tokenizer = load_policy(smollm2)
    eos = model_eos_token_ids(model, tokenizer)
    assert tokenizer.convert_ids_to_tokens(sorted(eos)) == ["<|im_end|>"]
    task = ChatTemplatedTask(load_task("gym:basic_arithmetic"), tokenizer)
    instances = task.examples(range(4))
    assert instances[0].prompt.startswith("<|im_start|>system") and instances[0].prompt.endswith(
        "<|im_start|>assistant\n")
    rollouts = generate(model, tokenizer, instances, 2, max_new_tokens=48, temperature=0.7)
    ended = [r for r in rollouts if r.tokens[-1] in eos]
    assert ended and all(len(r.tokens) < 48 for r in ended)
    assert any(len(r.tokens) % CHUNK for r in rollouts)  # a partial final chunk
    verdicts = verify_rollouts(model, tokenizer, task, rollouts, temperature=0.7, max_new_tokens=48,
                               stop_on_eos=True)
    assert all(v.ok for v in verdicts), [v.reason for v in verdicts if not v.ok]


def test_a_local_trainer_run_on_smollm2_uses_its_chat_template_and_completion_limit(
        smollm2: Path, model_home: Path, tmp_path: Path) -> None:
    """`trainer run --model smollm2` without a job: prompts in SmolLM2's chat template (its tokenizer has one)
    and completions up to the preset's limit, not the embedded model's 6 tokens; the summary says so."""
    run = tmp_path / "run"
    assert main(["--data-dir", str(model_home), "trainer", "run", "--model", SMOLLM2, "--dev-account", "0",
                 "--task", "gym:gcd:last-number", "--prompts-per-step", "4", "--group-size", "4",
                 "--optimizer-steps", "1", "--held-out-prompts", "2", "--steps", "1", "--threads", "2",
                 "--run-dir", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["task"], summary["chat_template"]) == ("gym:gcd:last-number", True)
    assert summary["max_new_tokens"] == PINNED.completion_tokens == 128 and summary["version"] == 1
    (step,) = [h for h in summary["history"] if h["version"] == 1][-1:]
    assert 6 < step["mean_tokens"] <= 128 and step["delta_bytes"] > 0
