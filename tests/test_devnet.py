"""`rollnet devnet` end to end: real anvil, real processes (trainer, workers, validators) with their own keys,
SQLite stores and libp2p hosts, and the faults a decentralized run must survive."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console
from rollnet.node.chain.job import LeaseStatus, Outcome
from rollnet.node.delta.checkpoint import content_root
from rollnet.node.events import iter_events
from rollnet.node.keeper import KEEPER_GRACE_S
from rollnet.node.model.policies import bf16_policy
from transformers import AutoModelForCausalLM

from rollnet.devnet import Devnet, DevnetConfig, finish_run, watch
from rollnet.devnet.observe import RunState
from rollnet.devnet.report import PLOTS

QUIET = Console(file=open(os.devnull, "w"))  # noqa: SIM115


def default_model(model_home: Path) -> Path:
    (model,) = (model_home / "models").glob("addition-2digit-*")
    return model


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def events_of(net: Devnet, name: str, kind: str) -> list[dict]:
    return [e for e in iter_events(net.participants[name].events_path) if e["kind"] == kind]


def log_tail(net: Devnet, name: str, lines: int = 40) -> str:
    """The end of a participant's process log, for an assertion's message."""
    return "\n".join(net.log_path(name).read_text(errors="replace").splitlines()[-lines:])


def chain_events(net: Devnet, name: str) -> list:
    job = net.job_client()
    return job.client.events(job.contract, name, 0)


def probe_gates(net: Devnet, tmp_path: Path) -> dict[str, tuple[bool, bool]]:
    """Ask every participant's host for policy announcements (a protected protocol) as an unregistered peer and
    as a freshly staked one: {name: (stranger served, staked peer served)}."""
    from rollnet.node.chain.registry import RegistryClient, Role
    from rollnet.node.p2p.host import P2PNode
    from rollnet.node.p2p.identity import b58encode, load_or_create_identity
    from rollnet.node.p2p.objects import ObjectStore

    registry = RegistryClient(net.client(19), net.deployment.registry)
    stranger, staked = (P2PNode(load_or_create_identity(tmp_path / name), ObjectStore(tmp_path / name / "objects"),
                                gate=None).start() for name in ("stranger", "staked"))
    try:
        registry.join(staked.identity, Role.WORKER, 10**18)
        served = {}
        for name, person in net.participants.items():
            peer = b58encode(registry.info(person.address).peer_id)
            addrs = [f"{a}/p2p/{peer}" for a in registry.listen_addrs(person.address)]
            results = []
            for probe in (stranger, staked):
                probe.connect(addrs)
                try:
                    probe.ask_policy(peer, 0)
                    results.append(True)
                except Exception:  # noqa: BLE001 - a refused stream is reset: any failure means "not served"
                    results.append(False)
            served[name] = tuple(results)
        return served
    finally:
        stranger.stop()
        staked.stop()


def test_a_two_step_devnet_pays_its_workers_behind_stake_gates_and_writes_the_report(tmp_path: Path,
                                                                                      model_home: Path) -> None:
    """Also: every role's host (trainer, worker, validator) refuses an unregistered peer and serves a staked one."""
    config = DevnetConfig(out=tmp_path / "run", workers=2, validators=1, steps=2, worker_delays=(),
                          model=default_model(model_home), held_out_every=1, baseline_steps=3)
    net = Devnet(config)
    try:
        net.start()
        wait_until(lambda: all(events_of(net, name, "start") for name in net.participants), 180, "every process")
        assert probe_gates(net, tmp_path / "probes") == {name: (False, True) for name in net.participants}
        state = RunState([(p.name, p.role, p.address, p.data_dir) for p in net.participants.values()])
        watch(net, state, QUIET, live=False, timeout_s=600)
        report = finish_run(net, state, QUIET)
        chain_root = net.job_client().policy_root(2).hex()
    finally:
        net.stop()

    assert report["steps"] == 2
    final = report["run"]["final_policy"]  # the chain's last version, out as a folder transformers loads as is
    assert final["version"] == 2 and final["folder"] in (tmp_path / "run" / "report.md").read_text()
    exported = AutoModelForCausalLM.from_pretrained(final["folder"])
    assert content_root(bf16_policy(exported)).hex() == final["root"] == chain_root
    trainer_events = list(iter_events(tmp_path / "run" / "trainer" / "events.jsonl"))
    trainer_steps = [e for e in trainer_events if e["kind"] == "step"]
    assert [s["version"] for s in trainer_steps] == [1, 2]
    # The trainer's demand: two steps of 32 prompts at 8 tasks a lease are 8 leases. The workers claim no more,
    # but for one lease each per read of the count they raced for (rollnet.node.demand); nothing more once done.
    demands = [e for e in trainer_events if e["kind"] == "demand"]
    first, last = demands[0], demands[-1]
    assert first["supply_groups"] == 8 * first["in_flight"] and first["wanted"] + first["in_flight"] == 8
    assert (last["steps_left"], last["wanted"]) == (0, 0)
    claims = [e for name in ("worker-0", "worker-1") for e in events_of(net, name, "claim")]
    assert 8 <= len(claims) <= 8 + 2 * 2, len(claims)
    assert all(s["samples"] > 0 for s in trainer_steps)  # at least one admitted rollout trained on per step
    trained = sum(s["groups"] for s in trainer_steps)  # the report's share of groups with reward spread
    spread = trained - sum(s["groups_without_signal"] for s in trainer_steps)
    assert 0 < report["signal_fraction"] == pytest.approx(spread / trained)
    assert "with reward spread" in (tmp_path / "run" / "report.md").read_text()
    paid = report["money"]["paid_wei"]
    assert paid and all(amount > 0 for amount in paid.values())  # on-chain payments after the challenge window
    assert sum(paid.values()) == report["money"]["decided"]["accepted"] * 64 * 10**15  # 64 samples x 0.001 ETH
    assert report["money"]["slashed_wei"] == {}
    assert report["gas"]["gas_per_accepted_sample"] > 0
    committees = report["committees"]  # every accepted batch was voted by its drawn committee, and shows it
    assert committees["leases_voted"] >= report["money"]["decided"]["accepted"] > 0
    assert "## Committees" in (tmp_path / "run" / "report.md").read_text()
    for name in ("report.json", "report.md", *PLOTS):
        assert (tmp_path / "run" / name).stat().st_size > 0
    assert "held-out greedy accuracy" in (tmp_path / "run" / "report.md").read_text()
    # Where the leases' time went, what the market trained per second against the local pipeline, and the CPU
    latency = report["latency"]
    for stage in ("claim", "seed wait", "generation + proofs", "submit", "seen by validators", "committee done",
                  "fetch", "verification", "verdict gossip + admission"):
        assert latency[stage] >= 0, stage
    assert latency["total"] >= latency["generation + proofs"] + latency["committee done"] > 0
    assert report["throughput"]["trained_samples_per_s"] > 0 and 0 < report["throughput"]["verification_fraction"]
    assert report["baseline"]["samples_per_s"] > 0 and report["efficiency"] > 0
    assert {"trainer", "worker", "validator", "chain", "orchestrator"} <= set(report["cpu"]["seconds"])
    assert all(0 <= share <= 1 for share in report["cpu"]["share"].values())
    markdown = (tmp_path / "run" / "report.md").read_text()
    assert "## Where a lease's time goes" in markdown and "efficiency against the local" in markdown
    for person in ("trainer", "worker-0", "worker-1", "validator-0"):  # every process kept its own data
        assert (tmp_path / "run" / person / "events.jsonl").exists()
    assert (tmp_path / "run" / "validator-0" / "validator.sqlite").exists()
    assert (tmp_path / "run" / "trainer" / "trainer.sqlite").exists()

    from io import StringIO

    from rollnet.node.keys import dev_account

    from rollnet.devnet.live import render

    state = RunState([(name, name.split("-")[0], dev_account(i + 1).address, tmp_path / "run" / name)
                      for i, name in enumerate(("trainer", "worker-0", "worker-1", "validator-0"))])
    state.read()
    screen = Console(file=StringIO(), width=160)
    screen.print(render(state, time.time() - 60, 2, 4, {"trainer": False, "worker-0": True}))
    text = screen.file.getvalue()
    assert "step 2/2" in text and "worker-1" in text and "validator-0" in text and "held-out" in text


def test_on_two_second_blocks_each_worker_overlaps_its_own_transactions(tmp_path: Path, model_home: Path) -> None:
    """With a block every 2 s (an L2's cadence, from the setup's end on) a worker claims ahead and submits on
    background lanes: its claims, seed draws and submissions share blocks (one after the other, each would take a
    block of its own), none of its transactions reverts, and the run trains, pays and reports its latency as on
    instant blocks."""
    config = DevnetConfig(out=tmp_path / "run", workers=2, validators=1, steps=2, worker_delays=(),
                          block_time_s=2, model=default_model(model_home))
    net = Devnet(config)
    try:
        net.start()
        state = RunState([(p.name, p.role, p.address, p.data_dir) for p in net.participants.values()])
        watch(net, state, QUIET, live=False, timeout_s=600)
        report = finish_run(net, state, QUIET)
        job = net.job_client()
        workers = {net.participants[name].address for name in ("worker-0", "worker-1")}
        mine = {e["args"]["leaseId"]: e["args"]["worker"] for e in chain_events(net, "TaskClaimed")
                if e["args"]["worker"] in workers}
        sent: dict[str, list[int]] = {address: [] for address in workers}
        for name in ("TaskClaimed", "SeedDrawn", "BatchSubmitted"):
            for event in chain_events(net, name):
                if event["args"]["leaseId"] in mine:
                    sent[mine[event["args"]["leaseId"]]].append(event["blockNumber"])
        for address, blocks in sent.items():
            assert len(set(blocks)) < len(blocks), (address, blocks)  # some of its transactions shared a block
        w3 = job.client.w3
        first, last = min(min(b) for b in sent.values()), max(max(b) for b in sent.values())
        spanned_s = w3.eth.get_block(last)["timestamp"] - w3.eth.get_block(first)["timestamp"]
        assert last > first and spanned_s >= 2 * (last - first) - 1  # the run's blocks came every 2 s (whole seconds)
        for number in range(net.deployment.deployed_at_block, w3.eth.block_number + 1):
            for tx in w3.eth.get_block(number, full_transactions=True)["transactions"]:
                if tx["from"] in workers:
                    assert w3.eth.get_transaction_receipt(tx["hash"])["status"] == 1, (number, tx["hash"].hex())
    finally:
        net.stop()
    assert report["run"]["block_time_s"] == 2 and report["steps"] == 2
    assert report["money"]["decided"]["accepted"] > 0 and report["money"]["slashed_wei"] == {}
    assert report["latency"]["total"] > report["latency"]["seed wait"] > 0
    assert report["throughput"]["trained_samples_per_s"] > 0


def test_the_run_survives_a_dead_worker_a_dead_validator_and_a_cheater(tmp_path: Path, model_home: Path) -> None:
    """worker-1 dies holding the leases it claimed: they expire (their fees are burned), their tasks are claimed again,
    nothing is paid twice. A validator dies: with two equal validators on every committee, one vote is not
    a majority of the stake, so submissions wait (never rejected) until it is back. The cheater is rejected
    and slashed."""
    config = DevnetConfig(out=tmp_path / "run", workers=2, validators=2, steps=6, worker_delays=(0.0, 60.0),
                          cheater="inflate", model=default_model(model_home))
    net = Devnet(config)
    try:
        net.start()
        job = net.job_client()
        # a bound on a hung start, no speed check: with both cores loaded, seven processes importing torch at once
        # took over two minutes before worker-1 could claim
        wait_until(lambda: events_of(net, "worker-1", "claim"), 300, "worker-1 to claim a lease")
        net.kill("worker-1")
        wait_until(lambda: len(events_of(net, "trainer", "step")) >= 2, 180, "two training steps")
        # It claims ahead: it dies holding every lease it claimed (the chain has each, mined or not logged).
        dead = net.participants["worker-1"].address
        held = {e["args"]["leaseId"]: e["args"]["firstTask"] for e in chain_events(net, "TaskClaimed")
                if e["args"]["worker"] == dead}
        assert held and all(job.lease(lease).status is LeaseStatus.LEASED for lease in held)

        net.kill("validator-1")
        cheater = net.participants["cheater"].address

        def waiting() -> list:
            leases = [job.lease(i) for i in range(1, job.status().lease_count + 1)]
            return [lease for lease in leases if lease.status is LeaseStatus.VOTING]

        wait_until(lambda: any(lease.worker != cheater for lease in waiting()), 60, "a batch waiting for votes")
        time.sleep(5)
        stuck = [lease for lease in waiting() if lease.worker != cheater]
        assert stuck  # half the stake is not a majority: honest batches wait, they are not rejected
        net.launch("validator-1")
        wait_until(lambda: all(job.lease(lease.lease_id).status is not LeaseStatus.VOTING for lease in stuck),
                   90, "the restarted validator to complete the majority")
        for lease in stuck:
            now = job.lease(lease.lease_id)
            assert now.status is LeaseStatus.PAID or (now.status, now.outcome) == (LeaseStatus.DECIDED,
                                                                                    Outcome.ACCEPT), now

        # The dead worker's leases expire, and every keeper's turn at reclaiming them comes.
        job.client.rpc("evm_increaseTime", [config.lease_seconds + 1 + 3 * KEEPER_GRACE_S])
        job.client.rpc("evm_mine", [])
        wait_until(lambda: all(job.lease(lease).status is LeaseStatus.RETURNED for lease in held), 30,
                   "a keeper to reclaim")
        wait_until(lambda: all(sum(e["args"]["firstTask"] == first for e in chain_events(net, "TaskClaimed")) == 2
                               for first in held.values()), 60, "the tasks to be claimed again")
        wait_until(lambda: not net.participants["trainer"].alive, 300, "the trainer to finish")
        state = RunState([(p.name, p.role, p.address, p.data_dir) for p in net.participants.values()])
        report = finish_run(net, state, QUIET)

        settled = Counter(e["args"]["leaseId"] for e in chain_events(net, "Settled"))
        assert all(n == 1 for n in settled.values())  # nothing settles (or is paid) twice
        assert not set(held) & set(settled)
        again = [e["args"]["leaseId"] for e in chain_events(net, "TaskClaimed")
                 if e["args"]["firstTask"] in held.values() and e["args"]["leaseId"] not in held]
        assert len(again) == len(held)
        # The run may end while a re-claimed lease is still being worked: then its holder either submits it
        # (and settling decides and pays or slashes it once) or loses it to the staleness bound (never paid), or
        # it was claimed ahead and never worked when the run stopped (it expires, never paid).
        submitted = {e["args"]["leaseId"] for e in chain_events(net, "BatchSubmitted")}
        lost = {e["lease"] for name in ("worker-0", "cheater") for e in events_of(net, name, "lost_lease")}
        for lease in again:
            trail = [e for name in net.participants for e in iter_events(net.participants[name].events_path)
                     if e.get("lease") == lease]
            if lease in submitted:
                assert settled[lease] == 1, trail
            else:
                assert lease in lost or job.lease(lease).status in (LeaseStatus.LEASED, LeaseStatus.RETURNED), trail
        outcomes = {e["args"]["leaseId"]: e["args"]["outcome"] for e in chain_events(net, "Settled")}
        for event in chain_events(net, "BatchSubmitted"):
            expected = Outcome.ACCEPT if event["args"]["worker"] != cheater else Outcome.REJECT
            assert outcomes[event["args"]["leaseId"]] == expected
        assert report["money"]["slashed_wei"].get("cheater", 0) >= 10**18
        # worker-0 is never slashed for its work; the test's 61-second jump may expire a lease it holds, which
        # costs it that lease's expiry fee (0.05 ETH), as an expired lease costs anyone
        honest = net.participants["worker-0"].address
        expired = sum(e["args"]["worker"] == honest for e in chain_events(net, "LeaseReturned"))
        assert report["money"]["slashed_wei"].get("worker-0", 0) == expired * 5 * 10**16
    finally:
        net.stop()


def test_the_run_survives_a_trainer_restart_and_a_frozen_chain(tmp_path: Path, model_home: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer is killed and restarted: it resumes from its last published version and no version is
    published twice or skipped; workers keep generating and the staleness bound holds. Anvil is frozen
    (SIGSTOP) past every client's request timeout: all wait, retry, and no transaction is lost or doubled."""
    monkeypatch.setenv("ROLLNET_RPC_TIMEOUT", "2")
    config = DevnetConfig(out=tmp_path / "run", workers=2, validators=1, steps=6, worker_delays=(),
                          model=default_model(model_home))
    net = Devnet(config)
    try:
        net.start()
        wait_until(lambda: len(events_of(net, "trainer", "step")) >= 2, 180, "two training steps")
        net.kill("trainer")
        last = max(e["version"] for e in events_of(net, "trainer", "step"))
        time.sleep(2)
        net.launch("trainer")
        wait_until(lambda: len(events_of(net, "trainer", "start")) == 2, 120, "the trainer to restart")
        assert events_of(net, "trainer", "start")[1]["version"] >= last  # resumed, not restarted from 0
        wait_until(lambda: len(events_of(net, "trainer", "step")) >= 4, 180, "training after the restart")

        net.freeze_chain(6.0)
        wait_until(lambda: not net.participants["trainer"].alive, 300, "the trainer to finish")
        assert net.participants["trainer"].process.returncode == 0, log_tail(net, "trainer")
        for name in ("worker-0", "worker-1", "validator-0"):
            assert net.participants[name].alive, f"{name} did not survive the frozen chain"
        assert any(events_of(net, n, "chain_unavailable") for n in ("worker-0", "worker-1", "trainer"))
        state = RunState([(p.name, p.role, p.address, p.data_dir) for p in net.participants.values()])
        report = finish_run(net, state, QUIET)

        published = [e["args"]["version"] for e in chain_events(net, "PolicyPublished")]
        assert published == list(range(1, config.steps + 1))  # each version once, none skipped
        for name in ("worker-0", "worker-1"):
            address = net.participants[name].address
            claims = [e["args"]["leaseId"] for e in chain_events(net, "TaskClaimed") if e["args"]["worker"] == address]
            # No claim lost or doubled (claims and submissions run on lanes: the log's order may differ).
            assert sorted(claims) == sorted(e["lease"] for e in events_of(net, name, "claim"))
            submits = [e["args"]["leaseId"] for e in chain_events(net, "BatchSubmitted")
                       if e["args"]["worker"] == address]
            assert sorted(submits) == sorted(e["lease"] for e in events_of(net, name, "submit"))
            # Every claim was submitted or said lost: none silently dropped (a submission meeting the frozen chain
            # once was, and its lease expired at the honest worker's cost).
            lost = {e.get("lease") for e in events_of(net, name, "lost_lease")}
            assert set(claims) <= set(submits) | lost, sorted(set(claims) - set(submits) - lost)
        assert int(max(report["staleness"]["histogram"], key=int)) <= config.max_staleness
        votes = Counter((e["args"]["leaseId"], e["args"]["round"], e["args"]["validator"])
                        for e in chain_events(net, "Voted"))
        assert votes and all(n == 1 for n in votes.values())
    finally:
        net.stop()


def processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_ctrl_c_stops_every_process_and_keeps_the_run_directory(tmp_path: Path, model_home: Path) -> None:
    import subprocess
    import sys

    out = tmp_path / "run"
    # Enough steps that the interrupt lands while training runs: the market now trains 50 embedded-model steps
    # before the validator's first events are seen, and a run already settling is another case.
    command = [sys.executable, "-m", "rollnet.cli", "devnet", "--out", str(out), "--workers", "1", "--validators",
               "1", "--steps", "5000", "--no-live", "--model", str(default_model(model_home))]
    devnet = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: (out / "worker-0" / "events.jsonl").exists() and any(
            e["kind"] == "submit" for e in iter_events(out / "worker-0" / "events.jsonl")), 180, "a submission")
        wait_until(lambda: (out / "validator-0" / "events.jsonl").exists(), 120, "the validator to start")
        assert len(processes_mentioning(str(out))) >= 4  # trainer, worker, validator, anvil (its state file)
        devnet.send_signal(signal.SIGINT)
        output, _ = devnet.communicate(timeout=60)
    finally:
        devnet.kill()
    assert devnet.returncode == 130, output
    assert "interrupted" in output and "Traceback" not in output
    assert processes_mentioning(str(out)) == []
    assert (out / "anvil-state.json").stat().st_size > 0
    for person in ("trainer", "worker-0", "validator-0"):
        assert (out / person / "events.jsonl").exists()


def test_stopping_asks_each_process_once_and_kills_what_does_not_stop(tmp_path: Path) -> None:
    """A participant that ignores SIGINT is killed once its time is up. One already asked to stop (the devnet's
    settlement asks workers and validators before a Ctrl-C's clean-up stops everyone) is not interrupted again in
    its own clean-up: it is waited for from its first asking, then killed."""
    import subprocess
    import sys

    from rollnet.devnet.network import Participant

    stubborn = ("import signal, time\n"
                "signal.signal(signal.SIGINT, lambda *_: print('asked', flush=True))\n"
                "print('ready', flush=True)\n"
                "while True: time.sleep(0.05)\n")
    net = Devnet(DevnetConfig(out=tmp_path))
    for name, role in (("worker-0", "worker"), ("validator-0", "validator")):
        person = Participant(name, role, 1, tmp_path / name, [])
        person.process = subprocess.Popen([sys.executable, "-c", stubborn], stdout=subprocess.PIPE, text=True)
        assert person.process.stdout.readline().strip() == "ready"
        net.participants[name] = person
    worker, validator = net.participants["worker-0"], net.participants["validator-0"]
    validator.asked_to_stop_at = time.monotonic() - 5  # asked 5 s ago, by the settlement
    started = time.monotonic()
    net.stop_roles("worker", "validator", timeout=2.0)
    assert not worker.alive and not validator.alive
    assert time.monotonic() - started < 10  # the validator's time was up already; the worker's after 2 s
    assert worker.process.stdout.read().split() == ["asked"]  # asked once, ignored it, killed
    assert validator.process.stdout.read().split() == []  # never interrupted again


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="this kernel has no autogroup scheduling")
def test_a_worker_in_its_own_session_yields_the_cores_across_sessions_too() -> None:
    """Each participant runs in its own session. Under autogroup scheduling a session's processes share one
    group, and groups share the CPU equally whatever their members' nice values: a worker yields the cores to
    the trainer and validators only once its session's group is niced too."""
    import subprocess
    import sys

    from rollnet.devnet.network import WORKER_NICENESS, nice_session

    probe = ("import os, sys; sys.stdin.readline(); print(os.nice(0)); "
             "print(open('/proc/self/autogroup').read().strip())")
    child = subprocess.Popen([sys.executable, "-c", probe], start_new_session=True, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, preexec_fn=lambda: os.nice(WORKER_NICENESS))
    assert nice_session(child.pid, WORKER_NICENESS)
    out, _ = child.communicate("go\n", timeout=60)
    nice, group = out.splitlines()
    assert int(nice) == WORKER_NICENESS and group.endswith(f" nice {WORKER_NICENESS}")


@pytest.mark.parametrize(("flags", "message"), [
    (["--model", "{tmp}/checkpoint"], "takes a folder `rollnet model init` built (the embedded model) or a preset"),
    (["--task", "gym:gcd:last-number"], "the embedded model is built for addition-2digit"),
    (["--model", "smollm2", "--task", "gym:no-such-dataset"], "reasoning-gym has no dataset"),
])
def test_the_devnet_refuses_a_model_or_task_it_cannot_run_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture, flags: list[str], message: str) -> None:
    """A folder rollnet did not build, a task the embedded model is not built for, or an unknown task is one
    line before any chain or process starts (no run directory is written), never a traceback."""
    from rollnet.cli import main

    (tmp_path / "checkpoint").mkdir()
    out = tmp_path / "run"
    argv = ["devnet", "--out", str(out), "--no-live", *(f.format(tmp=tmp_path) for f in flags)]
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists()


def test_a_real_model_devnet_asks_the_chain_for_the_preset_and_its_recipe(anvil: object, market: object,
                                                                           tmp_path: Path) -> None:
    """`rollnet devnet --model smollm2` creates a job whose on-chain recipe names the preset (its root and files
    hash pinned by rollnet), the chosen task, completions of up to 128 tokens that stop at EOS, and the chat
    template: what every worker, validator and the trainer then read from the chain."""
    from rollnet.node.chain.client import ChainClient
    from rollnet.node.chain.job import JobClient
    from rollnet.node.keys import dev_account
    from rollnet.node.model.pinned import PRESETS, SMOLLM2

    config = DevnetConfig.real_model(tmp_path / "run", SMOLLM2, "gym:gcd:last-number")
    config.check()
    assert (config.workers, config.validators, config.steps) == (2, 2, 5)
    net = Devnet(config, deployment=market)
    requester = ChainClient(anvil.url, dev_account(0))
    job = JobClient(requester, net._create_job(requester))
    recipe = job.spec().recipe
    assert (recipe.model_name, recipe.task_name) == (SMOLLM2, "gym:gcd:last-number")
    assert (recipe.max_new_tokens, recipe.chat_template, recipe.stop_on_eos) == (128, True, True)
    assert recipe.group_size == 4 and job.spec().tasks_per_lease == 4
    assert recipe.model_root == "0x" + PRESETS[SMOLLM2].root
    assert recipe.model_files_hash == "0x" + PRESETS[SMOLLM2].files_hash
    assert job.policy_root(0).hex() == PRESETS[SMOLLM2].root
