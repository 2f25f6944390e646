"""The trainer on the default model: buffer rules, recomputed rewards, resume without gaps or repeats,
non-finite batches that never reach the optimiser, and the local run's staleness."""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from eth_account import Account
from rollnet.node.delta.store import PolicyStore
from rollnet.node.errors import ConfigError
from rollnet.node.keys import dev_account
from rollnet.node.model.loading import load_policy
from rollnet.node.rollout.generate import Rollout, generate
from rollnet.node.tasks import load_task
from rollnet.trainer.buffer import RolloutBuffer
from rollnet.trainer.config import GRPOConfig
from rollnet.trainer.local import LocalRun
from rollnet.trainer.trainer import StepReport, Trainer, bf16_policy

TASK = load_task("addition-2digit")
SIGNER = Account.from_key("0x" + "5a" * 32)
DEV0 = dev_account(0).address


@pytest.fixture(scope="module")
def policy(model_home: Path) -> tuple:
    (folder,) = (model_home / "models").glob("addition-2digit-*")
    return load_policy(folder)


def fresh(policy: tuple) -> tuple:
    model, tokenizer = policy
    return copy.deepcopy(model), tokenizer


def rollout(seed: int, sample: int, version: int, tokens: list[int] | None = None) -> Rollout:
    tokens = tokens or [3, 4]
    return Rollout(seed, sample, [1, 2], tokens, [-0.5] * len(tokens), "", version, "")


def train_batch(trainer: Trainer, rollouts: list, on_persisted: Callable | None = None) -> None:
    """One step on a whole batch of groups, stamped with the trainer's current version."""
    buffer = RolloutBuffer(8, 4, trainer.model.config.vocab_size)
    buffer.advance(trainer.version)
    buffer.admit_all([dataclasses.replace(r, policy_version=trainer.version) for r in rollouts])
    trainer.train_on(buffer.take(8), on_persisted=on_persisted)


def test_buffer_admits_within_the_staleness_budget_and_keeps_groups_whole() -> None:
    buffer = RolloutBuffer(group_size=2, max_staleness=2, vocab_size=10)
    buffer.advance(5)
    assert buffer.admit(rollout(1, 0, 2)) == "too stale"
    assert buffer.admit(rollout(1, 0, 6)) == "invalid: policy version from the future"
    assert buffer.admit(rollout(1, 0, 3, tokens=[3, 99])) == "invalid: token outside the vocabulary"
    assert buffer.admit(rollout(1, 5, 3)) == "invalid: sample index outside the group"
    assert buffer.admit(rollout(1, 0, 3)) == "admitted"
    assert buffer.admit(rollout(1, 0, 3)) == "invalid: duplicate sample"
    assert buffer.ready_groups == 0  # half a group is never trainable
    assert buffer.admit(rollout(1, 1, 3)) == "admitted"
    assert buffer.admit_all([rollout(2, 0, 5), rollout(2, 1, 5)])["admitted"] == 2
    assert buffer.ready_groups == 2
    buffer.advance(6)  # the version-3 group is now 3 behind: dropped when versions move on
    taken = buffer.take(8)
    assert [(g.task_seed, g.version) for g in taken] == [(2, 5)]
    counts = buffer.counts
    assert (counts.admitted, counts.too_stale, counts.invalid) == (4, 3, 4)
    assert counts.staleness == {1: 2}


def test_rewards_come_from_the_tokens_not_the_workers_text(policy: tuple) -> None:
    model, tokenizer = fresh(policy)
    trainer = Trainer(model, tokenizer, TASK, GRPOConfig.make(group_size=2, prompts_per_step=1, optimizer_steps=1))
    instance = TASK.instance(7)
    eos = tokenizer.eos_token_id
    right_tokens, wrong_tokens = tokenizer.encode(instance.answer) + [eos], tokenizer.encode("1") + [eos]
    prompt = tokenizer.encode(instance.prompt)
    right = Rollout(7, 0, prompt, right_tokens, [0.0] * len(right_tokens), "wrong", 0, "")
    wrong = Rollout(7, 1, prompt, wrong_tokens, [0.0] * len(wrong_tokens), instance.answer, 0, "")  # text lies
    buffer = RolloutBuffer(2, 4, model.config.vocab_size)
    buffer.admit_all([right, wrong])
    (group,) = buffer.take(1)
    assert trainer.rewards(group) == [1.0, 0.0]


def test_local_steps_publish_versions_and_resume_without_gaps_or_repeats(policy: tuple, tmp_path: Path) -> None:
    config = GRPOConfig.make(prompts_per_step=8, optimizer_steps=2)
    model, tokenizer = fresh(policy)
    groups_source = LocalRun(Trainer(copy.deepcopy(model), tokenizer, TASK, config), seed=3)

    def batches(count: int) -> list:
        out = []
        for _ in range(count):  # the same groups for both trainers
            seeds = [groups_source.rng.randrange(10**9) for _ in range(8)]
            rollouts = generate(model, tokenizer, [TASK.instance(s) for s in seeds], 8, max_new_tokens=6, prove=False)
            out.append(rollouts)
        return out

    inputs = batches(4)

    straight = Trainer(copy.deepcopy(model), tokenizer, TASK, config)
    for rollouts in inputs:
        train_batch(straight, rollouts)

    state, store_dir = tmp_path / "state", tmp_path / "policies"
    first = Trainer(copy.deepcopy(model), tokenizer, TASK, config, state_dir=state,
                    store=PolicyStore(store_dir, trainer=SIGNER.address), signer=SIGNER)
    for rollouts in inputs[:2]:
        train_batch(first, rollouts)
    assert first.version == 2 and first.store.latest == 2
    del first  # killed: a new process starts from the saved state
    store = PolicyStore(store_dir, trainer=SIGNER.address)
    published_before = sorted(store.roots)
    second = Trainer(copy.deepcopy(model), tokenizer, TASK, config, state_dir=state, store=store, signer=SIGNER)
    assert second.version == 2 and sorted(store.roots) == published_before  # nothing republished
    for rollouts in inputs[2:]:
        train_batch(second, rollouts)
    assert second.version == straight.version == 4 and sorted(store.roots) == [0, 1, 2, 3, 4]
    for (name, a), b in zip(second.model.state_dict().items(), straight.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name  # optimiser state came back exactly
    materialized = PolicyStore(store_dir, trainer=SIGNER.address).materialize(4)
    assert all(torch.equal(materialized[n], t) for n, t in bf16_policy(second.model).items())


def test_a_crash_between_saving_and_publishing_publishes_once_on_restart(policy: tuple, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    model, tokenizer = fresh(policy)
    config = GRPOConfig.make(prompts_per_step=4, optimizer_steps=1)
    store = PolicyStore(tmp_path / "p", trainer=SIGNER.address)
    trainer = Trainer(model, tokenizer, TASK, config, state_dir=tmp_path / "s", store=store, signer=SIGNER)
    run = LocalRun(trainer, seed=1)

    def crash(*_args: object, **_kwargs: object) -> None:
        raise KeyboardInterrupt("killed between the state save and the publish")

    monkeypatch.setattr(store, "publish", crash)
    with pytest.raises(KeyboardInterrupt):
        while trainer.version == 0:
            run.step()
    monkeypatch.undo()
    assert store.latest == 0
    again = Trainer(copy.deepcopy(policy[0]), tokenizer, TASK, config, state_dir=tmp_path / "s",
                    store=PolicyStore(tmp_path / "p", trainer=SIGNER.address), signer=SIGNER)
    assert again.version == 1 and again.store.latest == 1


def test_non_finite_batches_never_reach_the_optimiser(policy: tuple) -> None:
    model, tokenizer = fresh(policy)
    trainer = Trainer(model, tokenizer, TASK, GRPOConfig.make(prompts_per_step=8, optimizer_steps=2))
    rollouts = generate(model, tokenizer, TASK.examples(range(100, 108)), 8, max_new_tokens=6, prove=False)
    buffer = RolloutBuffer(8, 4, model.config.vocab_size)
    buffer.admit_all(rollouts)
    groups = buffer.take(8)
    with torch.no_grad():  # the policy goes bad after the rollouts were made
        model.model.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
    before = {n: t.clone() for n, t in model.state_dict().items()}
    report = trainer.train_on(groups)
    assert report.samples > 0 and report.skipped_non_finite and report.optimizer_steps == 0
    assert trainer.version == 0 and trainer.skipped_batches == 1
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor.nan_to_num(), before[name].nan_to_num()), name
    assert not trainer.optimizer.state  # AdamW never stepped


def test_lagged_local_run_trains_at_exactly_the_lag(policy: tuple) -> None:
    model, tokenizer = fresh(policy)
    trainer = Trainer(model, tokenizer, TASK, GRPOConfig.make(prompts_per_step=4, optimizer_steps=1, max_staleness=4))
    run = LocalRun(trainer, lag=2, seed=0)
    for _ in range(6):
        run.step()
    staleness = run.buffer.counts.staleness
    assert set(staleness) <= {0, 1, 2} and staleness[2] > staleness[0] + staleness[1]
    assert run.sampling_version() == trainer.version - 2


def test_bad_settings_are_one_clear_error() -> None:
    with pytest.raises(ConfigError, match="epsilon"):
        GRPOConfig.make(epsilon=1.5)
    with pytest.raises(ConfigError, match="delta must be greater than 1"):
        GRPOConfig.make(delta=0.5)


def test_trainer_run_command_resumes_its_run_dir(model_home: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    from rollnet.cli import main

    common = ["--data-dir", str(model_home), "trainer", "run", "--dev-account", "0", "--prompts-per-step", "4",
              "--run-dir", str(tmp_path / "run")]
    assert main([*common, "--steps", "2"]) == 0
    assert main([*common, "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "resumed at version 2" in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["version"] == 3 and [h["version"] for h in summary["history"]] == [3]
    assert (summary["task"], summary["chat_template"], summary["max_new_tokens"]) == ("addition-2digit", False, 6)
    assert sorted(PolicyStore(tmp_path / "run" / "policies", trainer=DEV0).roots) == [0, 1, 2, 3]
    assert main([*common, "--steps", "4", "--epsilon", "2"]) == 1
    assert "trainer setting epsilon" in capsys.readouterr().err
    (base,) = (model_home / "models").glob("addition-2digit-*")  # a model folder: no build for the other task
    for flags, trained in ((["--max-new-tokens", "5"], "max_new_tokens 6, not 5"),
                           (["--temperature", "0.5"], "temperature 1.0, not 0.5"),
                           (["--task", "gym:basic_arithmetic", "--model", str(base)],
                            "task 'addition-2digit', not 'gym:basic_arithmetic'")):
        assert main([*common, "--steps", "4", *flags]) == 1  # a resumed run never mixes two rollout settings
        last = capsys.readouterr().err.strip().splitlines()[-1]  # (a vLLM test in this process may log above it)
        assert last.startswith("error: cannot resume") and f"its run trained with {trained}" in last, last
    assert main([*common, "--steps", "4", "--temperature", "inf"]) == 1
    assert "trainer setting temperature" in capsys.readouterr().err
    assert main([*common, "--steps", "4", "--raw-prompts", "--max-new-tokens", "6"]) == 0  # the same settings resume
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["version"] == 4


def test_a_trained_version_exports_as_a_folder_transformers_loads_with_the_version_root(
        model_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`trainer export` rebuilds version N from the store (anchor + signed deltas), writes config, tokenizer and
    bf16 safetensors, and checks the root; mistakes are one line and leave nothing behind."""
    from rollnet.node.delta.checkpoint import content_root
    from rollnet.node.model.identity import folder_model_files_hash
    from rollnet.node.model.policies import bf16_policy
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rollnet.cli import main

    run = tmp_path / "run"
    assert main(["--data-dir", str(model_home), "trainer", "run", "--dev-account", "0", "--prompts-per-step", "4",
                 "--run-dir", str(run), "--steps", "2"]) == 0
    store = PolicyStore(run / "policies", trainer=DEV0)
    export = ["--data-dir", str(model_home), "trainer", "export", "--run-dir", str(run)]
    assert main([*export, "--version", "2", "--out", str(tmp_path / "v2")]) == 0
    assert "the run's recorded root" in capsys.readouterr().out
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "v2")  # an ordinary folder: no rollnet code needed
    assert model.dtype == torch.bfloat16 and content_root(bf16_policy(model)) == store.roots[2] != store.roots[1]
    assert AutoTokenizer.from_pretrained(tmp_path / "v2").decode([5]) is not None
    (base,) = (model_home / "models").glob("addition-2digit-*")
    assert folder_model_files_hash(tmp_path / "v2") == folder_model_files_hash(base)

    def refused(argv: list[str], message: str) -> None:
        capsys.readouterr()
        assert main([*export, *argv]) == 1
        err = capsys.readouterr().err.strip()
        assert message in err and "Traceback" not in err and len(err.splitlines()) == 1, err

    refused(["--version", "1", "--out", str(tmp_path / "v2")], "is not an empty folder")
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    refused(["--version", "1", "--out", str(tmp_path / "link")], "(or is a link)")
    refused(["--version", "9", "--out", str(tmp_path / "v9")], "has no version 9 (versions: 0..2)")
    delta = store.delta_path(2)  # a corrupt delta: the rebuilt weights cannot be version 2's, so nothing is written
    data = bytearray(delta.read_bytes())
    data[len(data) // 2] ^= 0xFF
    delta.write_bytes(bytes(data))
    refused(["--version", "2", "--out", str(tmp_path / "bad")], "cannot rebuild version 2")
    assert not (tmp_path / "bad").exists() and not list(tmp_path.glob(".bad*"))
    refused(["--version", "2", "--out", str(tmp_path / "bad"), "--run-dir", str(tmp_path)], "not a trainer run")
    capsys.readouterr()  # another trainer key may not resume (and sign into) this run directory
    assert main(["--data-dir", str(model_home), "trainer", "run", "--dev-account", "1", "--prompts-per-step", "4",
                 "--run-dir", str(run), "--steps", "3"]) == 1
    assert f"is the run of trainer {DEV0}" in capsys.readouterr().err


def test_background_persistence_writes_each_version_as_trained_and_reports_it_once_written(
        policy: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The market trainer writes its state and delta on a background thread while the next step's forward passes
    run. The next optimiser step waits for the write, so each saved state is the version it names (the write
    here is slowed so that the next step overlaps it); a step's report comes back once its version is written,
    and a restart from that state resumes exactly."""
    config = GRPOConfig.make(prompts_per_step=8, optimizer_steps=2)
    model, tokenizer = fresh(policy)
    seeds = [[11 + 8 * b + i for i in range(8)] for b in range(3)]
    inputs = [generate(model, tokenizer, [TASK.instance(s) for s in batch], 8, max_new_tokens=6, prove=False)
              for batch in seeds]

    straight = Trainer(copy.deepcopy(model), tokenizer, TASK, config)
    expected = []
    for rollouts in inputs:
        train_batch(straight, rollouts)
        expected.append(copy.deepcopy(straight.model.state_dict()))

    written: list[dict[str, torch.Tensor]] = []
    real_save = torch.save

    def slow_save(state: object, path: object, *args: object, **kwargs: object) -> None:
        if isinstance(state, dict) and "optimizer" in state:
            time.sleep(0.5)  # the next step's forward passes run meanwhile
            written.append({name: tensor.clone() for name, tensor in state["model"].items()})
        real_save(state, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", slow_save)
    store = PolicyStore(tmp_path / "policies", trainer=SIGNER.address)
    background = Trainer(copy.deepcopy(model), tokenizer, TASK, config, state_dir=tmp_path / "state", store=store,
                         signer=SIGNER, persist_in_background=True)
    persisted: list[tuple[int, int | None, bool]] = []  # (version, its published version, whether on disk then)

    def on_persisted(report: StepReport) -> None:
        published = report.published.version if report.published else None
        persisted.append((report.version, published, len(written) == report.version + 1))

    train_batch(background, inputs[0], on_persisted)
    assert persisted == []  # still being written
    train_batch(background, inputs[1], on_persisted)
    background.close()
    assert persisted == [(1, 1, True), (2, 2, True)]  # in order, each once its state and delta were written
    assert len(written) == 3  # version 0, 1 and 2
    for version, state in enumerate(written[1:], start=1):
        for name, tensor in state.items():
            assert torch.equal(tensor, expected[version - 1][name]), (version, name)
    monkeypatch.undo()
    again = Trainer(copy.deepcopy(model), tokenizer, TASK, config, state_dir=tmp_path / "state",
                    store=PolicyStore(tmp_path / "policies", trainer=SIGNER.address), signer=SIGNER,
                    persist_in_background=True)
    assert again.version == 2 and again.store.latest == 2
    train_batch(again, inputs[2], on_persisted)
    again.close()
    assert persisted[-1][:2] == (3, 3) and sorted(again.store.roots) == [0, 1, 2, 3]
    for name, tensor in again.model.state_dict().items():
        assert torch.equal(tensor, expected[2][name]), name
