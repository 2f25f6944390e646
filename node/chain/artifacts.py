"""Contract ABIs and bytecode, read from forge's build output.

Invariant: the only source of ABIs is `contracts/out/<Name>.sol/<Name>.json` (or `ROLLNET_CONTRACTS_OUT`);
nothing is hand-copied, so Python and Solidity cannot drift apart.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from eth_utils import function_abi_to_4byte_selector
from rollnet.node.errors import ConfigError

CONTRACT_NAMES = ("NodeRegistry", "JobFactory", "TrainingJob")


def artifacts_dir() -> Path:
    """Forge's `out/` folder."""
    override = os.environ.get("ROLLNET_CONTRACTS_OUT")
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[2] / "contracts" / "out"


@dataclass(frozen=True)
class Artifact:
    name: str
    abi: list[dict]
    bytecode: str


@cache
def load_artifact(name: str) -> Artifact:
    path = artifacts_dir() / f"{name}.sol" / f"{name}.json"
    if not path.exists():
        raise ConfigError(f"contract artifact {path} is missing: run `make setup` (forge build)")
    data = json.loads(path.read_text())
    return Artifact(name=name, abi=data["abi"], bytecode=data["bytecode"]["object"])


@cache
def error_abis() -> dict[bytes, dict]:
    """Every custom error of our contracts, by its 4-byte selector."""
    errors: dict[bytes, dict] = {}
    for name in CONTRACT_NAMES:
        for item in load_artifact(name).abi:
            if item.get("type") == "error":
                errors[function_abi_to_4byte_selector(item)] = item
    return errors
