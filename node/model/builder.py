"""Build the embedded default model: tokenizer, Qwen2 config, and a short supervised warm-up on the task.

Invariants: the build is a pure function of its recipe (task, seed, sizes), and its folder is named by the
recipe's hash, so a second `rollnet model init` reuses it; training stops as soon as greedy accuracy on
held-out tasks reaches the target (so RL starts with signal but room to improve), or after `max_steps`:
work is bounded by steps, never by seconds, so a loaded machine builds the same weights as a quiet one,
only later; the result is an ordinary Hugging Face model folder plus `rollnet-model.json` describing the
build, whose bf16 content root for the default recipe is EMBEDDED_ROOT (a build that differs says so).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from rollnet.node.delta import content_root
from rollnet.node.model.identity import model_eos_token_ids
from rollnet.node.model.pinned import EMBEDDED_ROOT, EMBEDDED_TASK
from rollnet.node.model.tokenizer import build_char_tokenizer
from rollnet.node.tasks import Task, load_task
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

RECIPE_VERSION = 2
METADATA = "rollnet-model.json"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recipe:
    task: str = EMBEDDED_TASK
    seed: int = 0
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    feed_forward: int = 512
    target_accuracy: float = 0.25
    max_steps: int = 1500
    batch: int = 128
    lr: float = 3e-3
    version: int = RECIPE_VERSION

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def _alphabet(task: Task) -> str:
    chars = set()
    for instance in task.examples(range(2000)):
        chars.update(instance.prompt + instance.answer)
    return "".join(sorted(chars))


def _batch(task: Task, tokenizer: PreTrainedTokenizerFast, seeds: range) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of prompt+answer+eos, and labels that train only on the answer and eos."""
    rows, labels = [], []
    for instance in task.examples(seeds):
        prompt = tokenizer.encode(instance.prompt)
        answer = tokenizer.encode(instance.answer) + [tokenizer.eos_token_id]
        rows.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    target = torch.tensor([lab + [-100] * (width - len(lab)) for lab in labels])
    return ids, target


def greedy_accuracy(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, task: Task, seeds: range,
                    max_new_tokens: int = 6) -> float:
    """Fraction of held-out tasks a greedy decode answers exactly (prompts of equal length batch together)."""
    instances = task.examples(seeds)
    by_length: dict[int, list] = {}
    for instance in instances:
        by_length.setdefault(len(tokenizer.encode(instance.prompt)), []).append(instance)
    correct = 0
    model.eval()
    with torch.no_grad():
        for group in by_length.values():
            ids = torch.tensor([tokenizer.encode(i.prompt) for i in group])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=list(model_eos_token_ids(model, tokenizer)))
            for instance, row in zip(group, out[:, ids.shape[1]:], strict=True):
                text = tokenizer.decode(row, skip_special_tokens=True)
                correct += task.reward(instance, text) > 0
    model.train()
    return correct / len(instances)


def model_folder(cache: Path, recipe: Recipe = Recipe()) -> Path:
    """Where the build of `recipe` lives under `cache` (built there or not)."""
    return cache / f"{recipe.task.replace('/', '_').replace(':', '_')}-{recipe.key()}"


def build_default_model(cache: Path, recipe: Recipe = Recipe(), force: bool = False) -> Path:
    """The model folder for `recipe` under `cache`, built (about a minute on 2 cores) if missing."""
    folder = model_folder(cache, recipe)
    if (folder / METADATA).exists() and not force:
        return folder
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)  # a one-off build may use every core
    try:
        return _build(folder, recipe)
    finally:
        torch.set_num_threads(threads)


def _build(folder: Path, recipe: Recipe) -> Path:
    torch.manual_seed(recipe.seed)
    task = load_task(recipe.task)
    tokenizer = build_char_tokenizer(_alphabet(task))
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=recipe.hidden, intermediate_size=recipe.feed_forward,
        num_hidden_layers=recipe.layers, num_attention_heads=recipe.heads, num_key_value_heads=recipe.kv_heads,
        max_position_embeddings=256, tie_word_embeddings=True, bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen2ForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.0)
    held_out = range(10**9, 10**9 + 200)
    started, step, accuracy = time.monotonic(), 0, 0.0
    while step < recipe.max_steps:
        ids, labels = _batch(task, tokenizer, range(step * recipe.batch, (step + 1) * recipe.batch))
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % 50 == 0:
            accuracy = greedy_accuracy(model, tokenizer, task, held_out)
            log.info("warm-up step %d: loss %.3f, greedy accuracy %.2f", step, loss.item(), accuracy)
            if accuracy >= recipe.target_accuracy:
                break
    if step % 50:  # stopped by the step bound between evaluations: measure the weights being saved
        accuracy = greedy_accuracy(model, tokenizer, task, held_out)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    weights = {name: tensor.to(torch.bfloat16) for name, tensor in model.state_dict().items()}
    metadata = {
        "recipe": asdict(recipe), "steps": step, "seconds": round(time.monotonic() - started, 1),
        "held_out_greedy_accuracy": accuracy, "bf16_content_root": content_root(weights).hex(),
    }
    (tmp / METADATA).write_text(json.dumps(metadata, indent=2))
    if recipe == Recipe() and metadata["bf16_content_root"] != EMBEDDED_ROOT:
        log.warning("this machine built the embedded model with content root %s, not the %s… every other "
                    "machine builds: its rollouts will not match the job's base model (different hardware "
                    "arithmetic or package versions?)", metadata["bf16_content_root"][:16], EMBEDDED_ROOT[:16])
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def load_metadata(folder: Path) -> dict:
    return json.loads((folder / METADATA).read_text())
