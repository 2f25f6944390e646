"""Every command and sub-command, fed mistakes, each in its own process: a usage error exits 2 with click's
usage line and one `Error:` line, a runtime error exits 1 with one `error:` line, and nothing prints a
traceback; a command that needs a chain, given a dead one, says so in one line within seconds.

Invariant: the cases come from the command tree itself (typer's click commands, and each parameter's type,
range, path kind and `rollnet.node.cli.params` validator), so a new command or option is walked without
editing this file; every finding of issue 14 is an explicit case besides. All cases run in one subprocess
that imports rollnet once and forks a fresh process per case, which runs `rollnet.cli.main` as the console
script does (its own argv, environment, stdin, stdout, stderr and exit code); a few cases run through the
real `rollnet` script and `python -m rollnet.cli` as well. A case's process is killed after CASE_TIMEOUT_S.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import typer
from rollnet.node.cli import params
from rollnet.node.config import Deployment

from rollnet.cli import app

REPO = Path(__file__).resolve().parents[1]
ROLLNET = str(Path(sys.executable).with_name("rollnet"))
DEAD_RPC = "http://127.0.0.1:1"  # nothing listens on port 1: the connection is refused at once
ADDRESS = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"  # anvil dev account 1
BAD_CHECKSUM = "0x70997970C51812dc3A010C7d01b50e0d17dc79c8"  # the same, last letter's case flipped
PARALLEL = 2  # CI has 2 cores
CASE_TIMEOUT_S = 30.0
CHAIN_DEADLINE_S = 10.0  # a dead chain is reported within this (the connection is refused, not timed out)
ROOT_TAIL = ["keys", "show"]  # after a root option under test: quick, and touches nothing
# Commands that never talk to a chain; every other command is run against the dead one.
LOCAL_COMMANDS = {"keys new", "keys import", "keys show", "chain down", "model init", "model smollm2", "model identity",
                  "rollout generate", "rollout verify", "budget", "devnet"}
# What a chain command needs besides its required parameters to reach the chain.
CHAIN_EXTRAS = {"trainer run": ["--job", "latest"], "trainer export": ["--job", "latest"],
                "chain fund": ["--to", ADDRESS]}
# Path parameters of commands this project does not own yet, which do not declare a kind (file or folder).
UNDECLARED_PATHS = {("devnet", "--out")}  # devnet --model is a preset name or a folder: a string

BAD_VALUES: dict[Callable[..., Any], list[str]] = {
    params.eth_amount: ["-1", "abc", "1e-19", "1e12", "nan"],
    params.address: ["0x1234", "not-an-address", BAD_CHECKSUM],
    params.address_or_latest: ["0x1234", "newest", BAD_CHECKSUM],
    params.rpc_url: ["not-a-url", "ftp://127.0.0.1", "ws://127.0.0.1:8545", "http://", "http://127.0.0.1:99999"],
    params.log_level: ["nonsense"],
    params.multiaddr: ["garbage", "/ip4/999.0.0.1/tcp/1"],
    params.bootstrap: ["garbage", "@"],
}
GOOD_VALUES: dict[Callable[..., Any], str] = {
    params.eth_amount: "1", params.address: ADDRESS, params.address_or_latest: "latest", params.rpc_url: DEAD_RPC,
    params.log_level: "info", params.multiaddr: "/ip4/127.0.0.1/tcp/0", params.bootstrap: "/ip4/127.0.0.1/tcp/1",
}


@dataclass(frozen=True)
class Case:
    """One command line and what it must do: `usage` (exit 2), `runtime` (exit 1), `help` (exit 0) or
    `group` (a group without a sub-command: its help, exit 2). `pattern` must appear in the error line."""

    id: str
    argv: list[str]
    expect: str
    pattern: str = ""
    deadline_s: float | None = None
    spec_edit: tuple[str, str] | None = None  # {EDITED_SPEC} is examples/job.toml with this replacement
    env: dict[str, str] = field(default_factory=dict)


# ----------------------------------------------------------------------------- the command tree


def walk(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(path, command) for the root, every group and every leaf command, in a stable order."""
    yield path, command
    for name in sorted(getattr(command, "commands", {})):
        yield from walk(command.commands[name], (*path, name))


def is_group(command: Any) -> bool:
    return hasattr(command, "commands")


ROOT = typer.main.get_command(app)
TREE = list(walk(ROOT))
LEAVES = [(path, command) for path, command in TREE if not is_group(command)]


def validator_of(param: Any) -> Callable[..., Any] | None:
    """The `rollnet.node.cli.params` function behind a parameter's callback (typer wraps it)."""
    return getattr(param.callback, "__wrapped__", None) if param.callback else None


def annotation(param: Any) -> Any:
    return param.type_descriptor.annotation  # typer 0.29's parameter descriptor


def path_kind(param: Any) -> dict[str, bool] | None:
    """file_okay / dir_okay / writable of a Path parameter, or None when it declares no kind."""
    info = param.type_descriptor.parameter_info
    if annotation(param) is not Path or (info.file_okay and info.dir_okay):
        return None
    return {"file_okay": info.file_okay, "dir_okay": info.dir_okay, "writable": info.writable}


def label(param: Any) -> str:
    """How click names the parameter in its messages."""
    return param.opts[0] if param.param_type_name == "option" else (param.metavar or param.name)


def good_value(param: Any) -> str:
    """A value the parser accepts, for required parameters that are not under test."""
    check = validator_of(param)
    if check in GOOD_VALUES:
        return GOOD_VALUES[check]
    kind = path_kind(param)
    if kind is not None:
        if not kind["dir_okay"]:
            return "{OUT}" if kind["writable"] else "{SPEC}"
        return "{STATE}" if kind["writable"] else "{DIR}"
    if annotation(param) in (int, float):
        return str(param.min if param.min is not None else 1)
    raise AssertionError(f"no known good value for required parameter {label(param)}: add one to this test")


def bad_values(param: Any) -> list[tuple[str, str, str]]:
    """(name, value, expectation) for every mistake this parameter's declaration lets us derive."""
    if getattr(param, "is_flag", False):
        return []
    check = validator_of(param)
    if check is not None:
        assert check in BAD_VALUES, f"{label(param)} uses {check.__name__}: give it bad values in BAD_VALUES"
        # The first two through every parameter; all of them through each validator in test_validators.
        return [(f"bad-{i}", value, "usage") for i, value in enumerate(BAD_VALUES[check][:2])]
    cases = []
    kind = path_kind(param)
    if kind is not None:
        if not kind["dir_okay"]:
            cases.append(("a-directory", "{DIR}", "usage"))
        if not kind["file_okay"]:
            cases.append(("a-file", "{FILE}", "usage"))
        if not kind["writable"]:
            cases.append(("missing", "{MISSING}", "runtime"))
    if annotation(param) in (int, float):
        cases.append(("not-a-number", "abc", "usage"))
        if param.min is not None:
            cases.append(("below-min", str(param.min - 1), "usage"))  # negative where the minimum is 0
        if param.max is not None:
            cases.append(("above-max", str(param.max + 1), "usage"))
    return cases


def command_line(path: tuple[str, ...], command: Any, values: dict[str, str], omit: str | None = None) -> list[str]:
    """`path` with `values` for the named parameters and good values for the other required ones; arguments
    go after `--` so that a value such as -1 reaches the argument."""
    options, arguments = [], []
    for param in command.params:
        if param.name == omit:
            continue
        if param.name in values:
            value = values[param.name]
        elif param.required:
            value = good_value(param)
        else:
            continue
        if param.param_type_name == "option":
            options += [param.opts[0], value]
        else:
            arguments.append(value)
    return [*path, *options, *(["--", *arguments] if arguments else [])]


def parameter_cases(path: tuple[str, ...], command: Any, param: Any) -> list[Case]:
    """The parameter left out (when required) and each bad value its declaration lets us derive."""
    name, tail = " ".join(path) or "rollnet", ROOT_TAIL if not path else []
    cases = []
    if param.required:
        cases.append(Case(f"{name} without {label(param)}", command_line(path, command, {}, omit=param.name),
                          "usage", f"Missing (option|argument) '{re.escape(label(param))}'"))
    for what, value, expect in bad_values(param):
        argv = [*command_line(path, command, {param.name: value}), *tail]
        pattern = re.escape(label(param)) if expect == "usage" else ""
        cases.append(Case(f"{name} {label(param)} {what} {value}", argv, expect, pattern))
    return cases


def derived_cases() -> list[Case]:
    cases = []
    for path, command in TREE:
        name, tail = " ".join(path) or "rollnet", ROOT_TAIL if not path else []
        cases.append(Case(f"{name} --help", [*path, "--help"], "help"))
        if is_group(command):
            cases.append(Case(f"{name} (no sub-command)", [*path], "group"))
            cases.append(Case(f"{name} nosuchcommand", [*path, "nosuchcommand"], "usage", "No such command"))
        cases.append(Case(f"{name} --no-such-option", [*path, "--no-such-option", *tail], "usage", "No such option"))
        for param in command.params:
            cases += parameter_cases(path, command, param)
    return cases


def dead_chain_cases() -> list[Case]:
    """Every command that talks to a chain, pointed at one that does not answer."""
    cases = []
    for path, command in LEAVES:
        name = " ".join(path)
        if name in LOCAL_COMMANDS:
            continue
        argv = command_line(path, command, {})
        for param in command.params:
            if param.name == "dev_account":  # a funded key without a keystore
                argv[len(path):len(path)] = [param.opts[0], "0"]
        argv[len(path):len(path)] = CHAIN_EXTRAS.get(name, [])
        cases.append(Case(f"{name} on a dead chain", ["--rpc-url", DEAD_RPC, *argv], "runtime",
                          re.escape(f"no Ethereum node answers at {DEAD_RPC}"), deadline_s=CHAIN_DEADLINE_S))
    return cases


LOWER_CASE_JOB = "0x5fbdb2315678afecb367f032d93f642f64180aa3"
# Issue 14's findings, each as it was reported.
FINDINGS = [
    Case("finding: chain up --port 0", ["chain", "up", "--port", "0"], "usage", "--port"),
    Case("finding: chain up --port 70000", ["chain", "up", "--port", "70000"], "usage", "--port"),
    Case("finding: --dev-account 99", ["node", "status", "--dev-account", "99"], "usage", "--dev-account"),
    Case("finding: chain up --dev-account 99", ["chain", "up", "--dev-account", "99"], "usage", "--dev-account"),
    Case("finding: node unbond -1", ["node", "unbond", "-1"], "usage", "-1"),
    Case("finding: node unbond -- -1", ["node", "unbond", "--", "-1"], "usage", "AMOUNT.*non-negative"),
    Case("finding: node join without --stake", ["node", "join"], "usage", "Missing option '--stake'"),
    Case("finding: budget --change abc", ["budget", "--change", "abc"], "usage", "--change"),
    Case("finding: budget --budget -1", ["budget", "--budget", "-1"], "usage", "--budget"),
    Case("finding: nosuchcommand", ["nosuchcommand"], "usage", "No such command 'nosuchcommand'"),
    Case("finding: an unknown option", ["chain", "up", "--colour"], "usage", "No such option: --colour"),
    Case("finding: job deploy without --spec", ["job", "deploy", "--budget", "5"], "usage",
         "Missing option '--spec'"),
    Case("finding: job deploy --spec DIR", ["job", "deploy", "--spec", "{DIR}", "--budget", "5"], "usage",
         "--spec.*is a directory"),
    Case("finding: job deploy --spec MISSING", ["job", "deploy", "--spec", "{MISSING}", "--budget", "5"], "runtime",
         "spec file .* does not exist"),
    Case("finding: a lower-case job address is an address", ["--rpc-url", DEAD_RPC, "job", "status", LOWER_CASE_JOB],
         "runtime", "no Ethereum node answers"),
    Case("finding: a mistyped checksum", ["job", "status", BAD_CHECKSUM], "usage", "wrong EIP-55 checksum"),
    Case("finding: --rpc-url not-a-url", ["--rpc-url", "not-a-url", "node", "status"], "usage", "--rpc-url"),
    Case("finding: ROLLNET_RPC_URL=not-a-url", ["node", "status"], "usage", "--rpc-url",
         env={"ROLLNET_RPC_URL": "not-a-url"}),
    Case("finding: --log-level nonsense", ["--log-level", "nonsense", *ROOT_TAIL], "usage", "--log-level"),
    Case("finding: job deploy task no-such-task, before any transaction",
         ["--rpc-url", DEAD_RPC, "job", "deploy", "--spec", "{EDITED_SPEC}", "--budget", "5", "--dev-account", "0"],
         "runtime", "field 'task': unknown task 'no-such-task': use addition-2digit",
         spec_edit=('task = "addition-2digit"', 'task = "no-such-task"')),
    Case("finding: job deploy an unknown model, before any transaction",
         ["--rpc-url", DEAD_RPC, "job", "deploy", "--spec", "{EDITED_SPEC}", "--budget", "5", "--dev-account", "0"],
         "runtime", "field 'model': rollnet pins the root only of the 'embedded' model for 'addition-2digit' "
         r"and of the presets smollm2 \(any task\); for 'llama-9000' with task",
         spec_edit=('model = "embedded"', 'model = "llama-9000"')),
    Case("finding: job deploy --model FILE", ["job", "deploy", "--spec", "{SPEC}", "--budget", "5", "--model",
                                              "{FILE}"], "usage", "--model.*is a file"),
]
# The same mistakes through the installed entry points themselves.
# (Each costs a full import of rollnet, ~8 s of CPU, so there are two; their time includes that import.)
SCRIPT_CASES = [
    (Case("script: node status on a dead chain", ["--rpc-url", DEAD_RPC, "node", "status", "--dev-account", "0"],
          "runtime", "no Ethereum node answers"), [ROLLNET]),
    (Case("python -m: chain up --port 0", ["chain", "up", "--port", "0"], "usage", "--port"),
     [sys.executable, "-m", "rollnet.cli"]),
]
CASES = derived_cases() + dead_chain_cases() + FINDINGS


# ----------------------------------------------------------------------------- running the cases

RUNNER = r"""
import json, os, sys, time, traceback

cases_path, results_path, parallel = sys.argv[1], sys.argv[2], int(sys.argv[3])
from rollnet.cli import load_every_command, main
load_every_command()  # every sub-command imported once; every case runs in a process forked from here


def child(case):
    code = 1
    try:
        os.dup2(os.open(case["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 1)
        os.dup2(os.open(case["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.environ.clear()
        os.environ.update(case["env"])
        sys.argv = ["rollnet", *case["argv"]]
        code = main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()  # what the interpreter prints for an uncaught exception
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


cases = json.load(open(cases_path))
results = [None] * len(cases)
pending, running = list(range(len(cases))), {}
while pending or running:
    while pending and len(running) < parallel:
        index = pending.pop(0)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            child(cases[index])
        running[pid] = (index, time.monotonic())
    pid, status = os.waitpid(-1, os.WNOHANG)
    if pid == 0:
        for other, (index, started) in list(running.items()):
            if time.monotonic() - started > cases[index]["timeout"]:
                os.kill(other, 9)
        time.sleep(0.002)
        continue
    index, started = running.pop(pid)
    results[index] = {"rc": os.waitstatus_to_exitcode(status), "seconds": time.monotonic() - started}
json.dump(results, open(results_path, "w"))
"""


@dataclass(frozen=True)
class Result:
    rc: int
    stdout: str
    stderr: str
    seconds: float


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLNET_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def prepare(case: Case, home: Path) -> dict[str, Any]:
    """The case's own data directory (with a deployment on the dead chain) and its placeholders filled."""
    home.mkdir(parents=True)
    (home / "a-dir").mkdir()
    (home / "a-file.txt").write_text("not a folder\n")
    Deployment(chain_id=31337, rpc_url=DEAD_RPC, registry=ADDRESS, factory=ADDRESS, job_implementation=ADDRESS,
               deployed_at_block=0).save(home)
    spec = REPO / "examples" / "job.toml"
    if case.spec_edit is not None:
        old, new = case.spec_edit
        assert old in spec.read_text(), case.spec_edit
        (home / "edited.toml").write_text(spec.read_text().replace(old, new))
    places = {"{DIR}": home / "a-dir", "{FILE}": home / "a-file.txt", "{MISSING}": home / "missing" / "nothing",
              "{OUT}": home / "out.json", "{STATE}": home / "state", "{SPEC}": spec,
              "{EDITED_SPEC}": home / "edited.toml"}
    argv = [str(places.get(arg, arg)) for arg in case.argv]
    env = {**base_env(), "ROLLNET_HOME": str(home), **case.env}
    return {"argv": argv, "env": env, "stdout": str(home / "stdout"), "stderr": str(home / "stderr"),
            "timeout": CASE_TIMEOUT_S}


def read(job: dict[str, Any], rc: int, seconds: float) -> Result:
    return Result(rc, Path(job["stdout"]).read_text(errors="replace"), Path(job["stderr"]).read_text(errors="replace"),
                  seconds)


def run_forked(jobs: list[dict[str, Any]], root: Path) -> list[Result]:
    """Each prepared job in its own process forked from one that imported rollnet, PARALLEL at a time."""
    (root / "cases.json").write_text(json.dumps(jobs))
    runner = subprocess.run([sys.executable, "-c", RUNNER, str(root / "cases.json"), str(root / "results.json"),
                             str(PARALLEL)], capture_output=True, text=True, timeout=600, env=base_env())
    assert runner.returncode == 0, runner.stderr[-4000:]
    raw = json.loads((root / "results.json").read_text())
    return [read(job, r["rc"], r["seconds"]) for job, r in zip(jobs, raw, strict=True)]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    """Every case's result: CASES in the forking runner, SCRIPT_CASES through the real entry points, at once."""
    import time

    root = tmp_path_factory.mktemp("cli-mistakes")
    jobs = [prepare(case, root / f"case-{i}") for i, case in enumerate(CASES)]
    scripts = []
    for i, (case, command) in enumerate(SCRIPT_CASES):
        job = prepare(case, root / f"script-{i}")
        with open(job["stdout"], "w") as out, open(job["stderr"], "w") as err:
            process = subprocess.Popen([*command, *job["argv"]], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                       env=job["env"])
        scripts.append((case, job, process, time.monotonic()))
    out = {case.id: result for case, result in zip(CASES, run_forked(jobs, root), strict=True)}
    for case, job, process, started in scripts:
        rc = process.wait(timeout=120)
        out[case.id] = read(job, rc, time.monotonic() - started)
    return out


# ----------------------------------------------------------------------------- what each case must show


def check(case: Case, result: Result) -> None:
    both = result.stdout + result.stderr
    where = f"{case.argv}: rc {result.rc}\nstdout: {result.stdout[-2000:]}\nstderr: {result.stderr[-2000:]}"
    assert "Traceback" not in both, where
    assert result.rc != -9, f"killed after {CASE_TIMEOUT_S} s: {where}"
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if case.expect == "help":
        assert result.rc == 0 and "Usage" in result.stdout, where
    elif case.expect == "group":
        assert result.rc == 2 and "Usage" in both, where
    elif case.expect == "usage":
        assert result.rc == 2, where
        errors = [line for line in lines if line.startswith("Error: ")]
        assert len(errors) == 1 and len(lines) <= 3, where  # usage line, a hint, one error line
        assert re.search(case.pattern, errors[0]), f"{case.pattern!r} not in {errors[0]!r}; {where}"
    else:
        assert result.rc == 1, where
        assert len(lines) == 1 and lines[0].startswith("error: "), where
        assert re.search(case.pattern, lines[0]), f"{case.pattern!r} not in {lines[0]!r}; {where}"
    if case.deadline_s is not None:
        assert result.seconds < case.deadline_s, f"took {result.seconds:.1f} s: {where}"


@pytest.mark.parametrize("case", CASES + [case for case, _ in SCRIPT_CASES], ids=lambda case: case.id)
def test_a_mistake_is_one_clear_line(case: Case, results: dict[str, Result]) -> None:
    check(case, results[case.id])


@pytest.mark.parametrize("check", list(BAD_VALUES), ids=lambda check: check.__name__)
def test_validators(check: Callable[..., Any]) -> None:
    """Each shared validator refuses all of its bad values with a one-line message and keeps its good one."""
    for value in BAD_VALUES[check]:
        with pytest.raises(typer.BadParameter) as refused:
            check([value] if check is params.bootstrap else value)
        assert "\n" not in refused.value.message and len(refused.value.message) < 200
    good = GOOD_VALUES[check]
    assert check([good] if check is params.bootstrap else good) == ([good] if check is params.bootstrap else good)


def test_addresses_of_any_case_come_out_checksummed() -> None:
    assert params.address(ADDRESS.lower()) == ADDRESS == params.address(" " + ADDRESS.upper().replace("0X", "0x"))
    assert params.address_or_latest(ADDRESS.lower()) == ADDRESS and params.address_or_latest("Latest") == "latest"


def test_the_walk_reaches_every_command() -> None:
    names = {" ".join(path) for path, _ in LEAVES}
    assert {"chain up", "node unbond", "job deploy", "job status", "budget", "trainer run", "validator run"} <= names
    assert LOCAL_COMMANDS <= names, LOCAL_COMMANDS - names
    assert set(CHAIN_EXTRAS) <= names - LOCAL_COMMANDS
    assert len([c for c in CASES if c.expect == "usage"]) > 100


def test_every_path_parameter_declares_its_kind() -> None:
    """`**params.INPUT_FILE` (or INPUT_DIR, OUTPUT_FILE, STATE_DIR) on every Path, so the walk can feed a
    directory where a file belongs, a file where a folder belongs, and a missing input."""
    undeclared = {(" ".join(path), label(param)) for path, command in TREE for param in command.params
                  if annotation(param) is Path and path_kind(param) is None}
    assert undeclared == UNDECLARED_PATHS
