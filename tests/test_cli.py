"""The CLI as a user drives it, on a real anvil: the new-user flow, and one clear line for each mistake."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, advance_time, needs_vllm
from rollnet.node.chain.anvil import free_port, start_anvil
from rollnet.node.config import Deployment

from rollnet.cli import main

ROLLNET = str(Path(sys.executable).with_name("rollnet"))


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([ROLLNET, *args], capture_output=True, text=True, timeout=120, env=os.environ.copy())


def test_new_user_flow_with_the_console_script(data_dir: Path) -> None:
    """keys new, chain up, node join --stake 10, job deploy, job status, node status, chain down."""
    steps = [
        ("keys", "new"),
        ("chain", "up"),
        ("node", "join", "--stake", "10"),
        ("job", "deploy", "--spec", str(REPO / "examples" / "job.toml"), "--budget", "5"),
    ]
    try:
        outputs = []
        for step in steps:
            result = run(*step)
            assert result.returncode == 0, f"{step}: {result.stderr}"
            outputs.append(result.stdout)
        job = re.search(r"job (0x[0-9a-fA-F]{40}) created", outputs[-1]).group(1)
        status = run("job", "status", job)
        assert status.returncode == 0, status.stderr
        assert "5 ETH" in status.stdout and "8 x 8" in status.stdout
        assert "addition-2digit" in status.stdout and "up to 6 new tokens" in status.stdout  # the recipe
        node = run("node", "status")
        assert re.search(r"active stake \(free\)\s+10 ETH", node.stdout), node.stdout
        assert "16Uiu2HA" in node.stdout  # a secp256k1 libp2p peer ID, proven to the registry at join
        assert run("job", "status", "latest").stdout == status.stdout
    finally:
        down = run("chain", "down")
    assert down.returncode == 0 and "stopped anvil" in down.stdout
    assert not (data_dir / "deployment.json").exists()


@pytest.fixture
def chain_up(data_dir: Path):  # noqa: ANN201
    assert main(["chain", "up"]) == 0
    yield Deployment.load(data_dir)
    main(["chain", "down"])


def fails_with(capsys: pytest.CaptureFixture, argv: list[str], pattern: str) -> str:
    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert re.search(pattern, err), err
    return err


def test_stake_below_minimum_names_the_minimum(chain_up: Deployment, capsys: pytest.CaptureFixture) -> None:
    fails_with(capsys, ["node", "join", "--stake", "0.5", "--dev-account", "3"],
               r"stake 0\.5 ETH is below the worker minimum of 1 ETH")
    fails_with(capsys, ["node", "join", "--stake", "2", "--role", "validator", "--dev-account", "3"],
               r"below the validator minimum of 5 ETH")


def test_joining_twice(chain_up: Deployment, capsys: pytest.CaptureFixture) -> None:
    assert main(["node", "join", "--stake", "10", "--dev-account", "3"]) == 0
    fails_with(capsys, ["node", "join", "--stake", "10", "--dev-account", "3"], r"already registered")


def test_unbond_and_withdraw_too_early(chain_up: Deployment, capsys: pytest.CaptureFixture) -> None:
    fails_with(capsys, ["node", "unbond", "1", "--dev-account", "4"], r"is not registered: run `rollnet node join")
    fails_with(capsys, ["node", "withdraw", "--dev-account", "4"], r"nothing to withdraw")
    assert main(["node", "join", "--stake", "10", "--dev-account", "4"]) == 0
    fails_with(capsys, ["node", "unbond", "11", "--dev-account", "4"],
               r"needs 11 ETH of free stake, but only 10 ETH is free")
    assert main(["node", "unbond", "3", "--dev-account", "4"]) == 0
    fails_with(capsys, ["node", "withdraw", "--dev-account", "4"], r"not withdrawable until \d{4}-\d\d-\d\d")


def test_withdraw_after_the_unbonding_period(chain_up: Deployment, capsys: pytest.CaptureFixture) -> None:
    from rollnet.node.chain.client import ChainClient

    assert main(["node", "join", "--stake", "10", "--dev-account", "5"]) == 0
    assert main(["node", "unbond", "4", "--dev-account", "5"]) == 0
    advance_time(ChainClient(chain_up.rpc_url), 7 * 86_400 + 1)
    capsys.readouterr()
    assert main(["node", "withdraw", "--dev-account", "5"]) == 0
    assert "withdrew 4 ETH" in capsys.readouterr().out


def test_chain_that_does_not_answer(chain_up: Deployment, capsys: pytest.CaptureFixture) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    fails_with(capsys, ["--rpc-url", dead, "node", "status", "--dev-account", "1"],
               rf"no Ethereum node answers at {re.escape(dead)}")


def test_wrong_chain_id(chain_up: Deployment, capsys: pytest.CaptureFixture) -> None:
    other = start_anvil(chain_id=777)
    try:
        fails_with(capsys, ["--rpc-url", other.url, "node", "status", "--dev-account", "1"],
                   r"has id 777, but the deployment is on chain 31337")
    finally:
        other.stop()


def test_missing_or_wrong_keystore_password(data_dir: Path, capsys: pytest.CaptureFixture,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["keys", "new"]) == 0
    assert main(["chain", "up"]) == 0
    try:
        monkeypatch.setenv("ROLLNET_PASSWORD", "not the password")
        fails_with(capsys, ["node", "status"], r"wrong password for key 'default'")
        monkeypatch.delenv("ROLLNET_PASSWORD")
        fails_with(capsys, ["node", "status"], r"no password: set ROLLNET_PASSWORD")
        fails_with(capsys, ["node", "status", "--key", "nobody"], r"no key named 'nobody'")
    finally:
        main(["chain", "down"])


def _spec_with(tmp_path: Path, old: str, new: str) -> Path:
    text = (REPO / "examples" / "job.toml").read_text()
    assert old in text
    path = tmp_path / "job.toml"
    path.write_text(text.replace(old, new))
    return path


@pytest.mark.parametrize(
    ("old", "new", "pattern"),
    [
        ("committee_size = 3 ", "", r"missing field 'committee_size'"),
        ('trainer = "self"', 'trainer = "self"\narbiter = "self"', r"field 'arbiter' is gone: there is no arbiter"),
        ('slash_eth = "1" ', 'slash_eth = "100" ', r"field 'slash_eth' is out of the factory's bounds"),
        ('appeal_bond_eth = "0.5"', 'appeal_bond_eth = "0"', r"field 'appeal_bond_eth': Input should be greater"),
        ("group_size = 8 ", "group_size = 0 ", r"field 'group_size': Input should be greater than or equal to 2"),
        ("clip_epsilon = 0.2 ", "clip_epsilon = 1.5 ", r"field 'clip_epsilon': Input should be less than 1"),
        ('trainer = "self"', 'trainer = "0x1234"', r"field 'trainer'.*Ethereum address"),
        ("lease_seconds = 600 ", "lease_seconds = 600000 ", r"shorter than the registry's unbonding period"),
        ("max_staleness = 4 ", "max_staleness = 4\nstalenes = 3\n", r"unknown field 'stalenes'"),
        ('task = "addition-2digit"', 'task = "no-such-task"',
         r"field 'task': unknown task 'no-such-task': use addition-2digit, gym:<dataset>\[:<answer rule>\] or a "
         r"\.jsonl file"),
        ('model = "embedded"', 'model = "llama-9000"',
         r"field 'model': rollnet pins the root only of the 'embedded' model for 'addition-2digit' and of the presets "
         r"smollm2 \(any task\); for 'llama-9000'"),
        ('reward_per_sample_eth = "0.001"', 'reward_per_sample_eth = "1e70"', r"field 'reward_per_sample_eth'"),
        # A lease pays 64 x 0.02 = 1.28 ETH against a 1 ETH slash: faking all of it would pay.
        ('reward_per_sample_eth = "0.001"', 'reward_per_sample_eth = "0.02"',
         r"a cheat on 100% of a batch would pay: its expected slash \(1 ETH.*its gain \(that part's pay, 1\.28 ETH\)"),
        ("sampled_fraction = 0.03125 ", "sampled_fraction = 0 ", r"field 'sampled_fraction': Input should be greater"),
        ("detectable_cheat_fraction = 0.01 ", "detectable_cheat_fraction = 0.0000001 ",
         r"field 'detectable_cheat_fraction'"),
    ],
)
def test_bad_spec_fields(chain_up: Deployment, capsys: pytest.CaptureFixture, tmp_path: Path,
                         old: str, new: str, pattern: str) -> None:
    """Refused by name before any transaction: no job exists afterwards, so nothing was escrowed."""
    spec = _spec_with(tmp_path, old, new)
    fails_with(capsys, ["job", "deploy", "--spec", str(spec), "--budget", "5", "--dev-account", "0"], pattern)
    fails_with(capsys, ["job", "status", "latest"], r"no jobs exist yet")


def test_spec_file_missing_and_budget_too_small(chain_up: Deployment, capsys: pytest.CaptureFixture) -> None:
    fails_with(capsys, ["job", "deploy", "--spec", "/nonexistent.toml", "--budget", "5", "--dev-account", "0"],
               r"spec file /nonexistent.toml does not exist")
    fails_with(capsys, ["job", "deploy", "--spec", str(REPO / "examples" / "job.toml"), "--budget", "0.01",
                        "--dev-account", "0"], r"budget 0\.01 ETH does not cover one lease \(0\.064 ETH")


def test_job_status_of_a_non_job(chain_up: Deployment, capsys: pytest.CaptureFixture) -> None:
    fails_with(capsys, ["job", "status", chain_up.registry], r"is not a job created by the factory")
    fails_with(capsys, ["job", "status", chain_up.registry.lower()],  # any case is an address, checksummed
               rf"{chain_up.registry} is not a job created by the factory")
    fails_with(capsys, ["job", "status", "latest"], r"no jobs exist yet")


def test_commands_before_chain_up(data_dir: Path, capsys: pytest.CaptureFixture) -> None:
    fails_with(capsys, ["node", "status", "--dev-account", "1"], r"no deployment in .*: run `rollnet chain up` first")


def test_keys_new_show_import(data_dir: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["keys", "new", "--name", "alice"]) == 0
    out = capsys.readouterr().out
    address = re.search(r"0x[0-9a-fA-F]{40}", out).group(0)
    path = data_dir / "keys" / "alice.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert main(["keys", "show", "--name", "alice"]) == 0
    assert address in capsys.readouterr().out
    fails_with(capsys, ["keys", "new", "--name", "alice"], r"already exists")
    secret = "0x" + "ab" * 32
    monkeypatch.setenv("ROLLNET_PRIVATE_KEY", secret)
    assert main(["keys", "import", "--name", "bob"]) == 0
    captured = capsys.readouterr()
    assert "ab" * 32 not in captured.out + captured.err
    assert "ab" * 32 not in (data_dir / "keys" / "bob.json").read_text()
    monkeypatch.setenv("ROLLNET_PRIVATE_KEY", "0x1234")
    fails_with(capsys, ["keys", "import", "--name", "carol"], r"not a valid private key")


def test_chain_up_on_a_busy_port(data_dir: Path, capsys: pytest.CaptureFixture) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        fails_with(capsys, ["chain", "up", "--port", str(port)], rf"port {port} on 127.0.0.1 is already in use")
    assert not (data_dir / "deployment.json").exists()


def test_validator_run_joins_once_and_resumes(chain_up: Deployment, capsys: pytest.CaptureFixture,
                                              model_home: Path, data_dir: Path) -> None:
    """`rollnet validator run --once`: stakes as a validator the first time, then only resumes."""
    import shutil

    shutil.copytree(model_home / "models", data_dir / "models", dirs_exist_ok=True)  # the default model
    assert main(["job", "deploy", "--spec", str(REPO / "examples" / "job.toml"), "--budget", "1",
                 "--dev-account", "0"]) == 0
    fails_with(capsys, ["validator", "run", "--once", "--stake", "1", "--dev-account", "4"],
               r"below the validator minimum of 5 ETH")
    capsys.readouterr()
    assert main(["validator", "run", "--once", "--stake", "6", "--dev-account", "4"]) == 0
    first = capsys.readouterr().out
    assert "joined as validator" in first and "validating job" in first
    assert main(["validator", "run", "--once", "--dev-account", "4"]) == 0
    assert "joined" not in capsys.readouterr().out
    assert (data_dir / "validator.sqlite").exists()
    fails_with(capsys, ["validator", "run", "--once", "--job", "0x" + "12" * 20, "--dev-account", "4"],
               r"is not a job created by the factory")


@pytest.mark.parametrize("backend", ["transformers", pytest.param("vllm", marks=needs_vllm)])
def test_a_worker_and_two_validators_from_the_command_line(chain_up: Deployment, data_dir: Path, model_home: Path,
                                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture, backend: str) -> None:
    """`node work` claims a lease, generates at the published policy and serves the batch over libp2p;
    two `validator run --once` fetch it, verify it and vote; the batch is accepted on chain. With the vllm
    backend (chosen at `node join`), the validators' transformers prefill accepts what vLLM generated."""
    import threading
    import time

    from rollnet.node.chain.client import ChainClient
    from rollnet.node.chain.job import JobClient, LeaseStatus, Outcome
    from rollnet.node.delta.checkpoint import content_root
    from rollnet.node.delta.store import PolicyStore
    from rollnet.node.keys import dev_account
    from rollnet.node.model.loading import load_policy
    from rollnet.trainer.trainer import bf16_policy

    monkeypatch.setenv("ROLLNET_DEPLOYMENT", str(data_dir / "deployment.json"))
    (model,) = (model_home / "models").glob("addition-2digit-*")
    assert main(["job", "deploy", "--spec", str(REPO / "examples" / "job.toml"), "--budget", "1",
                 "--dev-account", "0"]) == 0
    trainer = dev_account(0)
    job = JobClient(ChainClient(chain_up.rpc_url, trainer), re.search(
        r"job (0x[0-9a-fA-F]{40}) created", capsys.readouterr().out).group(1))
    weights = bf16_policy(load_policy(model)[0])
    PolicyStore(tmp_path / "policies", trainer=trainer.address).publish(1, weights, trainer)
    job.publish_policy(1, content_root(weights))
    common = ["--model", str(model), "--policies", str(tmp_path / "policies")]
    worker = ["--data-dir", str(tmp_path / "worker")]
    assert main([*worker, "node", "join", "--stake", "10", "--dev-account", "1", "--backend", backend]) == 0
    for index in (2, 3):  # committees are drawn from the stake held before a batch is submitted
        assert main(["--data-dir", str(tmp_path / f"validator-{index}"), "node", "join", "--stake", "6", "--role",
                     "validator", "--dev-account", str(index)]) == 0
    codes: list[int] = []
    serving = threading.Thread(target=lambda: codes.append(main([*worker, "node", "work", "--leases", "1", "--serve",
                                                                  "30", "--dev-account", "1", *common])))
    serving.start()
    deadline = time.monotonic() + 240
    while not job.client.events(job.contract, "BatchSubmitted", 0) and time.monotonic() < deadline:
        time.sleep(0.5)
    (submitted,) = job.client.events(job.contract, "BatchSubmitted", 0)
    lease_id = submitted["args"]["leaseId"]
    for index in (2, 3):
        assert main(["--data-dir", str(tmp_path / f"validator-{index}"), "validator", "run", "--once",
                     "--dev-account", str(index), *common]) == 0
    lease = job.lease(lease_id)
    assert lease.status is LeaseStatus.DECIDED and lease.outcome is Outcome.ACCEPT
    before_status = capsys.readouterr().out
    assert main(["job", "status", job.address]) == 0  # each lease's round, committee votes and outcome
    status = capsys.readouterr().out
    voters = [dev_account(i).address[:8] for i in (2, 3)]
    assert all(f"{v}:A(50%)" in status for v in voters) and "accept" in status, status
    serving.join(timeout=60)
    assert codes == [0]
    out = before_status + capsys.readouterr().out
    assert "submitted 1 leases" in out and "drawn 1, judged 1, voted 1" in out
    from rollnet.node.events import iter_events

    (submit,) = [e for e in iter_events(tmp_path / "worker" / "events.jsonl") if e["kind"] == "submit"]
    assert submit["rollouts"] == 64 and submit["version"] == 1 and submit["lease"] == lease_id
    (start,) = [e for e in iter_events(tmp_path / "worker" / "events.jsonl") if e["kind"] == "start"]
    assert start["backend"] == backend
