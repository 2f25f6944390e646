"""Build the embedded default model: tokenizer, Qwen2 config, and a short supervised warm-up on the task.

Invariants: the build is a pure function of its recipe (task, seed, sizes), and its folder is named by the
recipe's hash, so a second `rollnet model init` reuses it; training stops as soon as greedy accuracy on
held-out tasks reaches the target (so RL starts with signal but room to improve), or after `max_steps`:
work is bounded by steps, never by seconds, so a loaded machine builds the same weights as a quiet one,
only later; the result is an ordinary Hugging Face model folder plus `rollnet-model.json` describing the
build.

Floating-point training is only bit-reproducible under one arithmetic: the kernels torch, MKL and oneDNN
pick differ by instruction set (an AVX-512 machine's fp32 sums round differently from an AVX2 one's), MKL's
also by CPU vendor (on an Intel CPU it runs other GEMM kernels than on an AMD one, whatever instruction set it
is allowed), and intra-op splits differ by thread count. So every warm-up runs in a child process pinned to
the AVX2 kernels in ATen and oneDNN, MKL's vendor-independent reproducible branch (`MKL_CBWR=COMPATIBLE`:
SSE2 code, the same on Intel and AMD, about 1.6x slower here), and `BUILD_THREADS` threads
(`PINNED_ARITHMETIC`). MKL's vector math (sqrt, rsqrt, cos, sin... on tensors) is not covered by that branch
and rounds by CPU, so the warm-up uses none of it (`warmup_arithmetic`: numpy's correctly rounded square root
in AdamW and RMSNorm, rotary tables from the C library's double cos and sin). The default recipe is not trained
at all unless asked (`rebuild`): its reference
build ships with rollnet (`reference/`) and is materialised after its bf16 content root is checked against
EMBEDDED_ROOT, so every machine starts the job from the same bits.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from rollnet.node.delta import content_root
from rollnet.node.errors import ConfigError
from rollnet.node.model.identity import folder_model_files_hash, model_eos_token_ids
from rollnet.node.model.pinned import EMBEDDED_FILES_HASH, EMBEDDED_ROOT, EMBEDDED_TASK
from rollnet.node.model.tokenizer import build_char_tokenizer
from rollnet.node.model.warmup_arithmetic import PinnedAdamW, pin_model
from rollnet.node.tasks import Task, load_task
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

RECIPE_VERSION = 4  # 3: MKL's vendor-independent branch in the pinned arithmetic; 4: no MKL vector math
METADATA = "rollnet-model.json"
REFERENCE = Path(__file__).with_name("reference")  # the default recipe's reference build
REFERENCE_WEIGHTS = REFERENCE / "addition-2digit.safetensors"
REFERENCE_METADATA = REFERENCE / "addition-2digit.json"
# The arithmetic every warm-up runs under, whatever the CPU: AVX2 kernels in ATen and oneDNN (an AVX-512 machine
# pinned so builds what an AVX2 one does), MKL's conditional-reproducibility branch that is the same on Intel and
# AMD CPUs (its AVX2 branch is Intel-only: an AMD CPU falls back to other kernels), and a fixed thread count.
BUILD_THREADS = 2
PINNED_ARITHMETIC = {"ATEN_CPU_CAPABILITY": "avx2", "DNNL_MAX_CPU_ISA": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                     "MKL_CBWR": "COMPATIBLE", "OMP_NUM_THREADS": str(BUILD_THREADS),
                     "MKL_NUM_THREADS": str(BUILD_THREADS)}
# Variables that would change that arithmetic if the caller's environment passed them on: never inherited.
UNPINNED_ARITHMETIC = ("MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE", "MKL_DYNAMIC", "MKL_THREADING_LAYER",
                       "MKL_DOMAIN_NUM_THREADS", "ONEDNN_DEFAULT_FPMATH_MODE", "DNNL_DEFAULT_FPMATH_MODE",
                       "GLIBC_TUNABLES")  # glibc's tunables could pick other libm variants (the rotary table's cos)
log = logging.getLogger("rollnet.node.model.builder")  # the same name in the pinned child


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


def build_default_model(cache: Path, recipe: Recipe = Recipe(), force: bool = False,
                        rebuild: bool = False) -> Path:
    """The model folder for `recipe` under `cache`, made if missing (or `force`d): the default recipe from its
    shipped reference build unless `rebuild`, any other recipe (or a rebuild) by a warm-up under the pinned
    arithmetic (about two minutes on 2 quiet cores for the default recipe)."""
    folder = model_folder(cache, recipe)
    if (folder / METADATA).exists() and not force:
        if is_built(cache, recipe, rebuild):
            return folder
        log.warning("the cached embedded model in %s is not the reference build (an older rollnet's, or a rebuild "
                    "that differed): replacing it", folder)
    try:
        if recipe == Recipe() and not rebuild:
            return _materialize_reference(folder)
        load_task(recipe.task)  # an unknown task is the caller's clear error, not a child's traceback
        folder.parent.mkdir(parents=True, exist_ok=True)
        child = subprocess.run([sys.executable, "-m", "rollnet.node.model.builder", str(folder),
                                json.dumps(asdict(recipe))], env=pinned_environment(), check=False)
    except OSError as error:
        raise ConfigError(f"cannot write the model under {cache}: {error}") from error
    if child.returncode != 0 or not (folder / METADATA).is_file():
        raise ConfigError(f"building the model for {recipe.task} failed (exit {child.returncode}); "
                          "its log is above")
    if recipe == Recipe() and (built := _recorded_root(folder)) != EMBEDDED_ROOT:
        log.warning("this machine rebuilt the embedded model with content root %s…, not the reference build's "
                    "%s…: its rollouts will not match a job's base model (different package versions?); the next "
                    "`rollnet model init` replaces it with the reference build", built[:16], EMBEDDED_ROOT[:16])
    return folder


def pinned_environment() -> dict[str, str]:
    """The warm-up child's environment: the caller's, less what would change its arithmetic, plus the pin."""
    inherited = {name: value for name, value in os.environ.items() if name not in UNPINNED_ARITHMETIC}
    return {**inherited, **PINNED_ARITHMETIC}


def is_built(cache: Path, recipe: Recipe = Recipe(), rebuild: bool = False) -> bool:
    """Whether `build_default_model` would reuse the cached folder: any recipe's finished build, except that
    the default recipe's must be the reference build unless it was asked to be rebuilt."""
    folder = model_folder(cache, recipe)
    return (folder / METADATA).exists() and (recipe != Recipe() or rebuild or _recorded_root(folder) == EMBEDDED_ROOT)


def _recorded_root(folder: Path) -> str | None:
    """The bf16 root a model folder's build record states (None if the record is unreadable). Roles never
    trust it: they compute the root of the weights they load."""
    try:
        return load_metadata(folder).get("bf16_content_root")
    except (OSError, ValueError, AttributeError):
        return None


def _skeleton(recipe: Recipe) -> tuple[Task, PreTrainedTokenizerFast, Qwen2ForCausalLM]:
    """The recipe's task, tokenizer and freshly initialised model (seeded by the recipe)."""
    torch.manual_seed(recipe.seed)
    task = load_task(recipe.task)
    tokenizer = build_char_tokenizer(_alphabet(task))
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=recipe.hidden, intermediate_size=recipe.feed_forward,
        num_hidden_layers=recipe.layers, num_attention_heads=recipe.heads, num_key_value_heads=recipe.kv_heads,
        max_position_embeddings=256, tie_word_embeddings=True, bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    return task, tokenizer, Qwen2ForCausalLM(config)


def _materialize_reference(folder: Path) -> Path:
    """Write the default recipe's folder from the shipped reference weights, refusing weights whose bf16
    content root is not EMBEDDED_ROOT (a damaged install)."""
    from safetensors.torch import load_file

    with torch.random.fork_rng():  # the skeleton's seeding must not reset the caller's generator
        _, tokenizer, model = _skeleton(Recipe())
    try:
        state = load_file(REFERENCE_WEIGHTS)
        metadata = json.loads(REFERENCE_METADATA.read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"the embedded model's reference build is unreadable ({error}): reinstall rollnet, "
                          "or run `rollnet model init --rebuild`") from error
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise ConfigError(f"the embedded model's reference weights do not fit its config (missing {missing}, "
                          f"unexpected {unexpected}): reinstall rollnet")
    model.tie_weights()
    root = content_root({name: tensor.to(torch.bfloat16) for name, tensor in model.state_dict().items()}).hex()
    if root != EMBEDDED_ROOT or metadata.get("bf16_content_root") != EMBEDDED_ROOT:
        raise ConfigError(f"the embedded model's reference weights have content root {root[:16]}…, not the "
                          f"pinned {EMBEDDED_ROOT[:16]}…: reinstall rollnet")
    if metadata.get("recipe") != asdict(Recipe()):
        raise ConfigError("the embedded model's reference build record names another recipe: reinstall rollnet")
    _save(folder, model, tokenizer, {**metadata, "source": "reference build"})
    if (files_hash := folder_model_files_hash(folder).hex()) != EMBEDDED_FILES_HASH:
        shutil.rmtree(folder, ignore_errors=True)
        raise ConfigError(f"this machine writes the embedded model's config and tokenizer with identity "
                          f"{files_hash[:16]}…, not the pinned {EMBEDDED_FILES_HASH[:16]}…: install the pinned "
                          "transformers and tokenizers (pip install -e .)")
    return folder


def _build(folder: Path, recipe: Recipe) -> Path:
    """The warm-up itself (run by the child process `build_default_model` starts)."""
    task, tokenizer, model = _skeleton(recipe)
    pin_model(model)  # no MKL vector math in the forward pass (warmup_arithmetic)
    optimizer = PinnedAdamW(model.parameters(), lr=recipe.lr)
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
    weights = {name: tensor.to(torch.bfloat16) for name, tensor in model.state_dict().items()}
    return _save(folder, model, tokenizer, {
        "recipe": asdict(recipe), "steps": step, "seconds": round(time.monotonic() - started, 1),
        "held_out_greedy_accuracy": accuracy, "bf16_content_root": content_root(weights).hex(),
    })


def _save(folder: Path, model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, metadata: dict) -> Path:
    """Write the model folder atomically: a reader sees a whole folder with its metadata, or none."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / METADATA).write_text(json.dumps(metadata, indent=2))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def load_metadata(folder: Path) -> dict:
    return json.loads((folder / METADATA).read_text())


def _child_main(folder: str, recipe_json: str) -> int:
    """Entry point of the pinned child: build `recipe_json` into `folder` under the pinned arithmetic."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(BUILD_THREADS)
    try:
        _build(Path(folder), Recipe(**json.loads(recipe_json)))
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(*sys.argv[1:]))
