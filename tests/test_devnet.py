"""`rollnet devnet` stands up a market: chain, contracts, a job and staked participants, then cleans up."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from rich.console import Console
from rollnet.node.chain.anvil import wait_until_answering
from rollnet.node.errors import ChainUnavailable

from rollnet.devnet import run_devnet


def test_devnet_registers_every_participant_and_stops_its_chain(tmp_path: Path) -> None:
    summary = run_devnet(tmp_path, workers=2, validators=2, stake_eth="10", budget_eth="5",
                         console=Console(file=open(os.devnull, "w")), keep=False)  # noqa: SIM115
    saved = json.loads((tmp_path / "devnet.json").read_text())
    assert saved == summary
    assert summary["escrow_wei"] == 5 * 10**18
    roles = [p["role"] for p in summary["participants"]]
    assert roles == ["worker", "worker", "validator", "validator"]
    for participant in summary["participants"]:
        key_file = Path(participant["data_dir"]) / "p2p-identity.key"
        assert key_file.stat().st_mode & 0o777 == 0o600
    with pytest.raises(ChainUnavailable):  # the devnet's chain is stopped when it returns
        wait_until_answering(summary["rpc_url"], timeout=0.5)
