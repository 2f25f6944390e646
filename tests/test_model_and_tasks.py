"""The embedded default model (built once per test session) and the task generators."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from rollnet.node.errors import ConfigError
from rollnet.node.model import builder
from rollnet.node.model.builder import Recipe, build_default_model, greedy_accuracy, load_metadata
from rollnet.node.model.tokenizer import build_char_tokenizer
from rollnet.node.tasks import load_task, seed_from_bytes
from rollnet.node.tasks.base import task_config_hash
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from rollnet.cli import main


def test_model_init_builds_a_loadable_model_that_solves_a_real_fraction(model_home: Path) -> None:
    (folder,) = (model_home / "models").glob("addition-2digit-*")
    metadata = load_metadata(folder)
    assert 0.2 <= metadata["held_out_greedy_accuracy"] <= 0.8
    assert metadata["steps"] <= Recipe().max_steps  # bounded by steps: a loaded machine only takes longer
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)  # the same path a real checkpoint takes
    task = load_task("addition-2digit")
    accuracy = greedy_accuracy(model, tokenizer, task, range(10**9, 10**9 + 200))
    assert accuracy == pytest.approx(metadata["held_out_greedy_accuracy"])
    assert 0.05 <= greedy_accuracy(model, tokenizer, task, range(5_000, 5_200)) <= 0.95


# The bf16 content root of Recipe(max_steps=10) under the builder's pinned arithmetic. MKL picks its GEMM kernels
# by CPU vendor as well as by instruction set, so the test builds it twice: once as this machine's MKL dispatches,
# once with MKL told it runs on an Intel CPU (its vendor check answered by a preloaded library). An AMD machine
# then builds what an Intel one does; an Intel machine builds its own bits twice.
TEN_STEP_ROOT = "f5a4fc305c644a92bf7b8683bbd5081eb20aa8acf2498392049c08a8f52b352a"
MKL_SAYS_INTEL = "int mkl_serv_intel_cpu_true(void) { return 1; }\nint mkl_serv_intel_cpu(void) { return 1; }\n"


def mkl_told_it_is_on_intel(tmp_path: Path) -> str:
    """A shared library that answers MKL's CPU-vendor check with "Intel", for LD_PRELOAD."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler, "this test needs a C compiler (cc or gcc) to build its MKL vendor shim"
    source, library = tmp_path / "mkl_says_intel.c", tmp_path / "libmkl_says_intel.so"
    source.write_text(MKL_SAYS_INTEL)
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return str(library)


def test_a_recipe_builds_the_same_weights_every_time_on_every_machine(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = Recipe(max_steps=10)
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "SSE4_2")  # a caller's arithmetic settings never reach the build
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    child_environment = builder.pinned_environment()
    assert "MKL_ENABLE_INSTRUCTIONS" not in child_environment and child_environment["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    as_dispatched = load_metadata(build_default_model(tmp_path / "a", recipe))
    shim = mkl_told_it_is_on_intel(tmp_path)
    monkeypatch.setenv("LD_PRELOAD", ":".join(filter(None, [shim, os.environ.get("LD_PRELOAD")])))
    as_on_intel = load_metadata(build_default_model(tmp_path / "b", recipe))
    assert as_dispatched["steps"] == as_on_intel["steps"] == 10
    assert as_dispatched["bf16_content_root"] == as_on_intel["bf16_content_root"] == TEN_STEP_ROOT

    if "AuthenticAMD" in Path("/proc/cpuinfo").read_text():
        # The shim reaches MKL: under the earlier pin (MKL's default, vendor-dispatched kernels) an AMD CPU builds
        # other bits with it than without it (here: CI's Intel machine's 27206ea6…, against a505c031…).
        earlier_pin = {name: value for name, value in builder.PINNED_ARITHMETIC.items() if name != "MKL_CBWR"}
        monkeypatch.setattr(builder, "PINNED_ARITHMETIC", {**earlier_pin, "MKL_ENABLE_INSTRUCTIONS": "AVX2"})
        monkeypatch.delenv("MKL_CBWR", raising=False)
        with_shim = load_metadata(build_default_model(tmp_path / "c", recipe))["bf16_content_root"]
        monkeypatch.delenv("LD_PRELOAD")
        without_shim = load_metadata(build_default_model(tmp_path / "d", recipe))["bf16_content_root"]
        assert with_shim != without_shim


def test_a_warm_up_step_uses_no_operator_whose_bits_the_cpu_chooses() -> None:
    """MKL's vector math rounds sqrt, cos, sin... to within an ulp, with kernels picked by CPU (an Intel Sapphire
    Rapids core rounded 15% of float32 square roots otherwise than the correctly rounded root, and built other
    10-step weights than the AMD machines). A warm-up step (forward, backward, AdamW) of the pinned model and a
    greedy evaluation (which decides the early stop) call none of ATen's VML-backed operators, nested calls
    included (the profiler records those), and the pinned forward is the stock model's within float rounding,
    also past the config's 256 positions."""
    import math
    import struct

    import numpy as np
    import torch
    from rollnet.node.model.warmup_arithmetic import VML_BACKED_OPS, PinnedAdamW, exact_sqrt, pin_model
    from torch.profiler import ProfilerActivity, profile

    values = torch.rand(4096) * 10 + 1e-3
    as_float = [struct.unpack("f", struct.pack("f", math.sqrt(v)))[0] for v in values.tolist()]
    assert exact_sqrt(values).tolist() == as_float  # correctly rounded (a double root rounded to float is)
    task, tokenizer, model = builder._skeleton(Recipe())
    ids, labels = builder._batch(task, tokenizer, range(32))
    stock = model(input_ids=ids, labels=labels)
    long = torch.randint(0, model.config.vocab_size, (1, 300))
    stock_long = model(input_ids=long).logits
    pin_model(model)
    assert torch.allclose(model(input_ids=long).logits, stock_long, atol=1e-5)
    optimizer = PinnedAdamW(model.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in model.parameters()]
    with profile(activities=[ProfilerActivity.CPU]) as recorded:
        pinned = model(input_ids=ids, labels=labels)
        optimizer.zero_grad()
        pinned.loss.backward()
        optimizer.step()
        builder.greedy_accuracy(model, tokenizer, task, range(10**9, 10**9 + 8))
    called = {event.key for event in recorded.key_averages()}
    assert {"aten::mm", "aten::addcdiv_", "aten::_scaled_dot_product_flash_attention_for_cpu_backward"} <= called
    assert not called & VML_BACKED_OPS, sorted(called & VML_BACKED_OPS)
    assert np.allclose(stock.logits.detach().numpy(), pinned.logits.detach().numpy(), atol=1e-5)
    assert all(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters(), strict=True))


def test_the_default_build_has_the_pinned_root(model_home: Path) -> None:
    """The embedded model is the same bits on every machine: its shipped reference build, checked against the
    root a job spec pins for it on chain (and rebuilt bit for bit by `model init --rebuild` under the pinned
    arithmetic; a machine that still builds other bits is told so, and fetches the model from peers instead:
    see test_late_join)."""
    from rollnet.node.model.identity import folder_model_files_hash
    from rollnet.node.model.pinned import EMBEDDED_FILES_HASH, EMBEDDED_ROOT

    (folder,) = (model_home / "models").glob("addition-2digit-*")
    assert load_metadata(folder)["bf16_content_root"] == EMBEDDED_ROOT
    assert folder_model_files_hash(folder).hex() == EMBEDDED_FILES_HASH


def test_damaged_reference_weights_are_refused_with_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture) -> None:
    """A reference file whose tensors were altered (a damaged or tampered install) never becomes the job's base
    model: `model init` names the root it found and writes no model folder."""
    from rollnet.node.model import builder
    from safetensors.torch import load_file, save_file

    state = load_file(builder.REFERENCE_WEIGHTS)
    name = next(iter(state))
    state[name] = state[name].clone()
    state[name].view(-1)[0] += 0.5
    damaged = tmp_path / "damaged.safetensors"
    save_file(state, damaged)
    monkeypatch.setattr(builder, "REFERENCE_WEIGHTS", damaged)
    capsys.readouterr()
    assert main(["--data-dir", str(tmp_path / "home"), "model", "init"]) != 0
    err = capsys.readouterr().err
    assert "reference weights have content root" in err and "reinstall rollnet" in err and "Traceback" not in err
    assert not list((tmp_path / "home" / "models").glob("addition-2digit-*"))


def test_model_identity_prints_what_a_spec_pins(model_home: Path, capsys: pytest.CaptureFixture) -> None:
    from rollnet.node.model.pinned import EMBEDDED_FILES_HASH, EMBEDDED_ROOT

    (folder,) = (model_home / "models").glob("addition-2digit-*")
    capsys.readouterr()
    assert main(["model", "identity", str(folder)]) == 0
    assert capsys.readouterr().out.split("\n")[:2] == [f'model_root = "0x{EMBEDDED_ROOT}"',
                                                       f'model_files_hash = "0x{EMBEDDED_FILES_HASH}"']
    assert main(["model", "identity", str(model_home)]) == 1  # not a model folder: one line, no traceback


def test_model_init_reuses_the_cache(model_home: Path, capsys: pytest.CaptureFixture) -> None:
    capsys.readouterr()
    assert main(["--data-dir", str(model_home), "model", "init"]) == 0
    assert re.search(r"cached model: .*addition-2digit-[0-9a-f]{16}", capsys.readouterr().out)
    assert main(["--data-dir", str(model_home), "model", "init", "--task", "nonsense"]) == 1


def test_char_tokenizer_round_trips_spaces_and_unknowns(tmp_path: Path) -> None:
    tokenizer = build_char_tokenizer("ab c+=0123456789")
    tokenizer.save_pretrained(tmp_path)
    reloaded = PreTrainedTokenizerFast.from_pretrained(tmp_path)
    for text in ("a b c", "12+ 3=15", "  "):
        assert reloaded.decode(reloaded.encode(text)) == text
    assert reloaded.encode("z") == [reloaded.unk_token_id]


def test_tasks_are_pure_functions_of_their_seed(tmp_path: Path) -> None:
    addition = load_task("addition-2digit")
    instance = addition.instance(7)
    assert instance == addition.instance(7) and re.fullmatch(r"\d\d\+\d\d=", instance.prompt)
    assert addition.reward(instance, f" {instance.answer}\n") == 1.0 and addition.reward(instance, "0") == 0.0
    gym = load_task("gym:basic_arithmetic")
    item = gym.instance(11)
    assert item == gym.instance(11) and gym.reward(item, item.answer) == 1.0 and gym.reward(item, "nope") == 0.0
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"prompt": "2+2=", "answer": "4"}) + "\n" + json.dumps({"prompt": "q", "answer": "a"}))
    jsonl = load_task(str(path))
    assert jsonl.instance(3).prompt == "q" and jsonl.reward(jsonl.instance(2), "4") == 1.0
    assert seed_from_bytes(bytes(range(32))) == int.from_bytes(bytes(range(8)), "big")


def test_gym_answer_rules_pick_what_the_scorer_sees_and_are_pinned_by_the_task_hash() -> None:
    """A small model writes prose around its answer: `last-number` and `answer-tag` score the answer only,
    and a task named with a rule hashes differently from the whole-completion one, so the chain pins it."""
    whole, number, tag = (load_task(f"gym:gcd{rule}") for rule in ("", ":last-number", ":answer-tag"))
    item = number.instance(3)
    prose = f"The numbers share 1,000 divisors? No: the GCD is {item.answer}."
    assert whole.reward(whole.instance(3), prose) < 1.0 and number.reward(item, prose) == 1.0
    assert number.reward(item, "no number here") == 0.0 and number.reward(item, f"{item.answer} or maybe 999999") < 1
    tagged = tag.instance(3)
    assert tagged.prompt.startswith(item.prompt) and "<answer>" in tagged.prompt
    assert tag.reward(tagged, f"think <answer>0</answer> then <answer> {item.answer} </answer>") == 1.0
    assert tag.reward(tagged, item.answer) == 0.0
    hashes = {task_config_hash(task) for task in (whole, number, tag)}
    assert len(hashes) == 3 and task_config_hash(load_task("gym:gcd:last-number")) in hashes
    for rule in ("first-word", "whole", ""):  # the whole completion has one name only: gym:gcd
        with pytest.raises(ConfigError, match=f"unknown answer rule '{rule}'.*last-number, answer-tag, or gym:gcd "):
            load_task(f"gym:gcd:{rule}")


def test_a_scorer_that_raises_on_a_completion_scores_it_zero() -> None:
    """Some reasoning-gym scorers parse their input and raise on odd text: a worker's completion must not
    crash the trainer, a worker or a validator computing its reward; it scores 0 for all of them."""
    for name, completion in (("gym:boxnet:last-number", "I think the answer is 2."),
                             ("gym:prime_factorization:last-number", "maybe 2.5"),
                             ("gym:prime_factorization", "hello")):
        task = load_task(name)
        assert task.reward(task.instance(0), completion) == 0.0


def test_bad_task_names_and_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown task"):
        load_task("chess")
    with pytest.raises(ConfigError, match="no dataset"):
        load_task("gym:not_a_dataset")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:1"):
        load_task(str(bad))


def test_a_cached_default_model_that_is_not_the_reference_is_replaced(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    """An older rollnet's build (or a rebuild that came out different) in the cache is never handed out as the
    embedded model: `model init` writes the reference build over it."""
    from rollnet.node.model.pinned import EMBEDDED_ROOT

    home = tmp_path / "home"
    assert main(["--data-dir", str(home), "model", "init"]) == 0
    (folder,) = (home / "models").glob("addition-2digit-*")
    record = json.loads((folder / "rollnet-model.json").read_text())
    (folder / "rollnet-model.json").write_text(json.dumps({**record, "bf16_content_root": "b6177bab" * 8}))
    capsys.readouterr()
    assert main(["--data-dir", str(home), "model", "init"]) == 0
    assert load_metadata(folder)["bf16_content_root"] == EMBEDDED_ROOT
    assert "cached model" not in capsys.readouterr().out
    assert "is not the reference build" in caplog.text


def test_writing_the_reference_leaves_the_callers_random_stream_alone(tmp_path: Path) -> None:
    """`trainer run --seed N` seeds torch before it resolves the model: writing the reference build on first use
    must not reseed it, or a first run and a rerun would draw different numbers."""
    import torch

    torch.manual_seed(5)
    expected = torch.rand(4)
    torch.manual_seed(5)
    build_default_model(tmp_path / "models")
    assert torch.equal(torch.rand(4), expected)


def test_an_unwritable_model_cache_is_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").write_text("a file where the cache folder should be")
    capsys.readouterr()
    assert main(["--data-dir", str(home), "model", "init"]) != 0
    err = capsys.readouterr().err
    assert "cannot write the model under" in err and "Traceback" not in err
