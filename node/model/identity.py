"""A model's identity beyond its weights: what its config and tokenizer make a participant compute, as one hash
the job's recipe pins on chain (`modelFilesHash`), and the one rule for which tokens end a completion.

Invariants:
- `eos_token_ids` is the only place the set of completion-ending tokens is decided: the tokenizer's EOS plus
  every EOS the model's generation config lists (instruct models ship several: end of turn, end of text).
  Generation on either backend stops at any of them and the validators' bounds check accepts exactly them,
  so a worker and its validators always agree where a completion ends.
- `model_files_hash` is keccak256 of the canonical JSON (`node.canonical`) of:
  the architecture config (`to_dict()`, without the keys that record how it was saved or how it is being run:
  `transformers_version`, the dtype, `_`-prefixed, `use_cache`, output/label settings); the fast tokenizer's
  whole definition (`tokenizer.json` as the tokenizers library writes it, without the padding and truncation
  a caller may have switched on); the settings kept beside it that change encode or decode
  (TOKENIZER_SETTINGS: space clean-up, splitting special tokens, BOS/EOS/prefix-space insertion); its special
  tokens; its chat template; and the sorted EOS set. The weights' dtype and the attention implementation are
  not part of it: `loading.load_policy` always loads fp32 weights with SDPA attention, whatever a config says.
  It is a property of the loaded objects, not of file bytes, so a `save_pretrained` → `from_pretrained` round
  trip (how anchors travel between peers) keeps it; two folders with the same hash tokenize, template, stop
  and build the same architecture identically; any change to those (a vocabulary entry, a normaliser, a
  rope theta, a norm epsilon, an extra EOS, a template) changes it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rollnet.node.canonical import canonical_keccak
from rollnet.node.errors import ConfigError

# Config keys that describe serialisation or run-time switches, not the function the weights compute.
RUNTIME_CONFIG_KEYS = frozenset({
    "transformers_version", "dtype", "torch_dtype", "use_cache", "output_hidden_states", "output_attentions",
    "return_dict", "id2label", "label2id", "problem_type", "chunk_size_feed_forward", "is_encoder_decoder",
    "name_or_path",
})
RUNTIME_TOKENIZER_KEYS = ("padding", "truncation")
# Settings transformers keeps outside tokenizer.json (in tokenizer_config.json) that change what encode or
# decode returns: decode feeds the reward, encode the prompt check.
TOKENIZER_SETTINGS = ("clean_up_tokenization_spaces",
                      "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output",
                      "split_special_tokens", "add_bos_token", "add_eos_token", "add_prefix_space")


def _ids(value: Any, source: str) -> list[int]:
    """Token ids from a config value: None, one id, or a list of ids (each a non-negative int, never a bool)."""
    if value is None:
        return []
    items = value if isinstance(value, list | tuple) else [value]
    if not all(isinstance(item, int) and not isinstance(item, bool) and item >= 0 for item in items):
        raise ConfigError(f"{source} eos_token_id must be a token id or a list of token ids, not {str(value)[:60]}")
    return list(items)


def eos_token_ids(tokenizer: Any, generation_config: Any | None = None) -> tuple[int, ...]:
    """Every token id that ends a completion, sorted (see the module invariants)."""
    ids = set(_ids(tokenizer.eos_token_id, "the tokenizer's"))
    if generation_config is not None:
        ids.update(_ids(getattr(generation_config, "eos_token_id", None), "the generation config's"))
    return tuple(sorted(ids))


def model_eos_token_ids(model: Any, tokenizer: Any) -> tuple[int, ...]:
    """`eos_token_ids` of a loaded model (its `generation_config`, which transformers derives from the config
    when the folder has no generation_config.json)."""
    return eos_token_ids(tokenizer, getattr(model, "generation_config", None))


def folder_generation_config(folder: Path, config: Any) -> Any:
    """The generation config a model loaded from `folder` gets: its generation_config.json, else the one
    transformers derives from `config`."""
    from transformers import GenerationConfig

    if (folder / "generation_config.json").is_file():
        return GenerationConfig.from_pretrained(folder)
    return GenerationConfig.from_model_config(config)


def architecture(config: Any) -> dict[str, Any]:
    return {key: value for key, value in config.to_dict().items()
            if not key.startswith("_") and key not in RUNTIME_CONFIG_KEYS}


def tokenizer_definition(tokenizer: Any) -> dict[str, Any]:
    definition = json.loads(tokenizer.backend_tokenizer.to_str())
    for key in RUNTIME_TOKENIZER_KEYS:
        definition.pop(key, None)
    return definition


def tokenizer_settings(tokenizer: Any) -> dict[str, Any]:
    values = {key: getattr(tokenizer, key, None) for key in TOKENIZER_SETTINGS}
    return {key: value for key, value in values.items() if isinstance(value, bool | int | str)}


def model_files_hash(config: Any, tokenizer: Any, eos_ids: Iterable[int]) -> bytes:
    """The 32-byte identity of a model's config and tokenizer (see the module invariants)."""
    return canonical_keccak({
        "architecture": architecture(config),
        "tokenizer": tokenizer_definition(tokenizer),
        "tokenizer_settings": tokenizer_settings(tokenizer),
        "special_tokens": tokenizer.special_tokens_map,
        "chat_template": tokenizer.chat_template,
        "eos_token_ids": sorted(eos_ids),
    })


def loaded_model_files_hash(model: Any, tokenizer: Any) -> bytes:
    """`model_files_hash` of a loaded model and its tokenizer."""
    return model_files_hash(model.config, tokenizer, model_eos_token_ids(model, tokenizer))


def folder_model_files_hash(folder: Path, config: Any | None = None, tokenizer: Any | None = None) -> bytes:
    """`model_files_hash` of a model folder's config and tokenizer (given, or loaded from it), without
    loading any weights."""
    from transformers import AutoConfig, PreTrainedTokenizerFast

    config = config if config is not None else AutoConfig.from_pretrained(folder, trust_remote_code=False)
    tokenizer = tokenizer if tokenizer is not None else PreTrainedTokenizerFast.from_pretrained(folder)
    return model_files_hash(config, tokenizer, eos_token_ids(tokenizer, folder_generation_config(folder, config)))
