"""A model's config-and-tokenizer identity (`modelFilesHash` on chain) and the one EOS set every role uses.

The identity survives the way anchors travel (save_pretrained, then from_pretrained on another machine) and a
caller's padding, and changes with anything that changes what a participant computes or how text becomes
tokens. A model whose generation config lists a second EOS (as instruct models ship) stops there on the
transformers backend, and the validator accepts exactly those completions: with the tokenizer's EOS alone
it would have rejected honest work.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from rollnet.node.delta.checkpoint import content_root
from rollnet.node.errors import ConfigError
from rollnet.node.model.identity import eos_token_ids, folder_model_files_hash, loaded_model_files_hash
from rollnet.node.model.loading import load_policy
from rollnet.node.model.pinned import EMBEDDED_ROOT
from rollnet.node.model.policies import bf16_policy
from rollnet.node.p2p.anchors import model_files
from rollnet.node.rollout.generate import generate
from rollnet.node.rollout.verify import verify_rollouts
from rollnet.node.tasks import load_task

from rollnet.cli import main

TASK = load_task("addition-2digit")


@pytest.fixture(scope="module")
def embedded(model_home: Path) -> Path:
    (folder,) = (model_home / "models").glob("addition-2digit-*")
    return folder


def _copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def _edit_json(path: Path, change: dict) -> None:
    data = json.loads(path.read_text())
    data.update(change)
    path.write_text(json.dumps(data))


def test_the_identity_survives_the_trip_between_peers(embedded: Path, tmp_path: Path) -> None:
    model, tokenizer = load_policy(embedded)
    here = loaded_model_files_hash(model, tokenizer)
    assert folder_model_files_hash(embedded) == here
    received = tmp_path / "received"
    received.mkdir()
    for name, data in model_files(model, tokenizer).items():  # what an anchor server offers
        (received / name).write_bytes(data)
    assert folder_model_files_hash(received) == here
    tokenizer("12+34=", padding="max_length", max_length=16, truncation=True)  # run-time state, not identity
    assert loaded_model_files_hash(model, tokenizer) == here


@pytest.mark.parametrize("change", ["normaliser", "vocabulary", "norm epsilon", "rope theta", "chat template",
                                    "second EOS", "space clean-up", "split special tokens"])
def test_every_change_to_how_text_maps_or_the_model_computes_changes_the_identity(
        embedded: Path, tmp_path: Path, change: str) -> None:
    folder = _copy(embedded, tmp_path / "changed")
    before = folder_model_files_hash(folder)
    if change == "normaliser":
        _edit_json(folder / "tokenizer.json", {"normalizer": {"type": "Lowercase"}})
    elif change == "vocabulary":
        definition = json.loads((folder / "tokenizer.json").read_text())
        vocab = definition["model"]["vocab"]
        first, second = sorted(token for token in vocab if token.isdigit())[:2]
        vocab[first], vocab[second] = vocab[second], vocab[first]  # "0" and "1" swapped: same size, same specials
        (folder / "tokenizer.json").write_text(json.dumps(definition))
    elif change == "norm epsilon":
        _edit_json(folder / "config.json", {"rms_norm_eps": 1e-5})
    elif change == "rope theta":
        _edit_json(folder / "config.json", {"rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}})
    elif change == "space clean-up":  # decode (so the reward) changes: "12 , 3" reads "12, 3"
        _edit_json(folder / "tokenizer_config.json", {"clean_up_tokenization_spaces": True})
    elif change == "split special tokens":  # encode (so the prompt check) changes on "<eos>" in text
        _edit_json(folder / "tokenizer_config.json", {"split_special_tokens": True})
    elif change == "chat template":
        _edit_json(folder / "tokenizer_config.json", {"chat_template": "{{ messages[0]['content'] }}="})
    else:
        _edit_json(folder / "generation_config.json", {"eos_token_id": [1, 3]})
    assert folder_model_files_hash(folder) != before, change


def test_a_second_eos_ends_completions_and_the_validator_accepts_exactly_those(embedded: Path,
                                                                               tmp_path: Path) -> None:
    folder = _copy(embedded, tmp_path / "two-eos")
    model, tokenizer = load_policy(folder)
    second = tokenizer.convert_tokens_to_ids("0")  # a digit: many answers contain one
    _edit_json(folder / "generation_config.json", {"eos_token_id": [tokenizer.eos_token_id, second]})
    model, tokenizer = load_policy(folder)
    stops = eos_token_ids(tokenizer, model.generation_config)
    assert stops == tuple(sorted({tokenizer.eos_token_id, second}))
    instances = TASK.examples(range(200, 216))
    made = generate(model, tokenizer, instances, 4, max_new_tokens=6, temperature=1.0)
    ended_at_second = [r for r in made if r.tokens[-1] == second]
    assert ended_at_second, "no completion reached the second EOS"
    assert all(second not in r.tokens[:-1] and tokenizer.eos_token_id not in r.tokens[:-1] for r in made)
    recipe = {"max_new_tokens": 6, "stop_on_eos": True, "temperature": 1.0}
    verdicts = verify_rollouts(model, tokenizer, TASK, made, **recipe)  # the model's own EOS set
    assert all(v.ok for v in verdicts), [v.reason for v in verdicts if not v.ok]
    # A validator that knew only the tokenizer's EOS would have called the short ones truncated: honest work
    # rejected (what vLLM, stopping on the generation config's EOS list, met before the set was one rule).
    short = [r for r in ended_at_second if len(r.tokens) < 6]
    assert short
    narrow = verify_rollouts(model, tokenizer, TASK, short, eos_token_ids=[tokenizer.eos_token_id], **recipe)
    assert all(not v.ok and v.reason.startswith("truncated") for v in narrow), [v.reason for v in narrow]
    # A completion that runs on past the second EOS is refused before any prefill.
    longer = [r for r in made if r.tokens[-1] != second and len(r.tokens) >= 2]
    assert longer
    cheat = longer[0]
    cheat.tokens = [second] + cheat.tokens[1:]
    (verdict,) = verify_rollouts(model, tokenizer, TASK, [cheat], **recipe)
    assert not verdict.ok and "continues past the EOS at token 0" in verdict.reason


def test_every_role_loads_fp32_with_sdpa_whatever_the_config_says(embedded: Path, tmp_path: Path) -> None:
    """dtype and attention implementation are outside the identity, so the one load path fixes them."""
    reference = load_policy(embedded)[0]
    folder = _copy(embedded, tmp_path / "loose")
    _edit_json(folder / "config.json", {"dtype": "bfloat16", "_attn_implementation": "eager"})
    model, tokenizer = load_policy(folder)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert model.config._attn_implementation == "sdpa"
    assert loaded_model_files_hash(model, tokenizer) == folder_model_files_hash(embedded)
    ids = torch.tensor([tokenizer.encode("12+34=")])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, reference(input_ids=ids).logits)


@pytest.mark.parametrize("value", [[[1, 2]], [1, 4.5], "1", True, -1, 99_999])
def test_a_malformed_eos_list_is_one_line_error(embedded: Path, tmp_path: Path, value: object,
                                                capsys: pytest.CaptureFixture) -> None:
    folder = _copy(embedded, tmp_path / "bad-eos")
    _edit_json(folder / "generation_config.json", {"eos_token_id": value})
    with pytest.raises(ConfigError, match="eos_token_id must be|outside its vocabulary"):
        load_policy(folder)
    capsys.readouterr()
    assert main(["model", "identity", str(folder)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and "eos" in err.lower()


def test_model_identity_reads_the_weights_not_a_copied_folder_s_build_notes(embedded: Path, tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture) -> None:
    """A fine-tuned copy of the embedded folder keeps its rollnet-model.json; its root is its weights'."""
    model, tokenizer = load_policy(embedded)
    with torch.no_grad():
        model.model.norm.weight.add_(0.5)
    tuned = _copy(embedded, tmp_path / "tuned")
    model.save_pretrained(tuned)
    capsys.readouterr()
    assert main(["model", "identity", str(tuned)]) == 0
    printed = capsys.readouterr().out
    assert f"0x{content_root(bf16_policy(load_policy(tuned)[0])).hex()}" in printed
    assert EMBEDDED_ROOT not in printed
