"""Where a policy comes from: the embedded default (its reference build, written on demand), a preset rollnet
converts itself (`--model smollm2`, or a job whose spec names it), or a local Hugging Face folder.

Invariant: every model the node runs is loaded by `load_policy(folder)`, the one path the default and a
real checkpoint share (`from_pretrained`, always fp32 weights with SDPA attention, whatever the config
says); a missing or unreadable folder, or one whose EOS tokens lie outside the vocabulary, is a ConfigError
naming it, never a traceback. A `--model` value that is a preset's bare name means the preset; if a
folder of that name also exists here, the value is refused as ambiguous (an absolute path names the folder).
"""

from __future__ import annotations

from pathlib import Path

import torch
from rollnet.node.errors import ConfigError
from rollnet.node.model.builder import METADATA, Recipe, build_default_model, model_folder
from rollnet.node.model.identity import model_eos_token_ids
from rollnet.node.model.pinned import PRESETS, SMOLLM2
from rollnet.node.model.smollm2 import materialize_smollm2
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerFast
from transformers.utils import logging as transformers_logging

PRESET_BUILDERS = {SMOLLM2: materialize_smollm2}  # name -> cache folder -> model folder (converted once)


def preset_of(model: Path | None, job_model_name: str | None = None) -> str | None:
    """The preset meant: `model` when it is a preset's bare name and no existing path; with no `model`, the
    job's model name when that is a preset; else None."""
    if model is None:
        return job_model_name if job_model_name in PRESETS else None
    if str(model) not in PRESETS:
        return None
    if model.exists():
        raise ConfigError(f"--model {model} names both the {model} preset and a folder here: give the folder as an "
                          "absolute path, or run elsewhere for the preset")
    return str(model)


def resolve_model(data_dir: Path, model: Path | None, task: str = Recipe.task,
                  job_model_name: str | None = None) -> Path:
    """The preset `model` names (or, with no `model`, the job's), converted on first use; else `model` (it
    must be a model folder); else the embedded default for `task`."""
    preset = preset_of(model, job_model_name)
    if preset is not None:
        return PRESET_BUILDERS[preset](data_dir / "models")
    if model is None:
        return build_default_model(data_dir / "models", Recipe(task=task))
    if not (model / "config.json").is_file():
        raise ConfigError(f"{model} is not a Hugging Face model folder (no config.json); "
                          "pass a local checkpoint folder or omit --model for the embedded default")
    return model


def cached_model(data_dir: Path, model: Path | None, task: str = Recipe.task,
                 job_model_name: str | None = None) -> Path | None:
    """What `resolve_model` would give without training anything: a preset (converted here if its extra is
    installed; the job's preset without the extra gives None, so peers supply it), `model` when given (it
    must be a model folder), else the embedded default for `task` if it is already built, else None."""
    preset = preset_of(model, job_model_name)
    if preset is not None and model is None:
        try:
            return PRESET_BUILDERS[preset](data_dir / "models")
        except ConfigError:
            return None
    if model is not None:
        return resolve_model(data_dir, model, task)
    folder = model_folder(data_dir / "models", Recipe(task=task))
    return folder if (folder / METADATA).is_file() else None


def load_policy(folder: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """The model (eval mode, fp32) and its fast tokenizer from a model folder."""
    if not (folder / "tokenizer.json").is_file():
        raise ConfigError(f"{folder} has no tokenizer.json: rollnet needs a fast (tokenizers) tokenizer")
    transformers_logging.disable_progress_bar()  # a progress bar per load is noise in a node's output
    try:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
        # fp32 weights and SDPA attention whatever the config says: neither is part of `model_files_hash`.
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
        if model.config._attn_implementation != "sdpa":  # a config's own `_attn_implementation` wins the load
            model.set_attn_implementation("sdpa")
    except Exception as exc:  # noqa: BLE001 - a broken file fails in transformers and tokenizers in many ways
        raise ConfigError(f"cannot load the model in {folder}: {_first_line(exc)}") from None
    if tokenizer.eos_token_id is None:
        raise ConfigError(f"the tokenizer in {folder} has no end-of-sequence token")
    vocab = model.config.vocab_size
    if any(not 0 <= token < vocab for token in model_eos_token_ids(model, tokenizer)):
        raise ConfigError(f"the model in {folder} names an end-of-sequence token outside its vocabulary ({vocab})")
    if not hasattr(getattr(model, "model", None), "norm"):
        raise ConfigError(f"{type(model).__name__} has no final norm at model.norm: TOPLOC cannot commit to it")
    return model.eval(), tokenizer


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__
