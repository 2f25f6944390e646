"""Malformed job spec files, generated from a fixed seed, fed to the spec loader and a few of them to
`rollnet job deploy --spec`: each is refused with one ConfigError line (on the command line: exit 1 and one
`error:` line naming the file), never a traceback; whatever passes is a spec `deploy` can encode.

Invariant: bounded and repeatable: ITERATIONS mutations drawn from SEED (a few seconds in-process), and
len(CLI_SPECS) of them through one forked-runner subprocess (see test_cli_mistakes).
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO
from rollnet.node.chain.artifacts import load_artifact
from rollnet.node.errors import ConfigError
from rollnet.node.spec import MAX_SPEC_BYTES, JobSpecFile, check_workable, load_job_spec
from test_cli_mistakes import DEAD_RPC, Case, check, prepare, run_forked
from web3 import Web3
from web3.contract import Contract

SEED = 14  # issue 14
ITERATIONS = 400
EXAMPLE = (REPO / "examples" / "job.toml").read_text()
LINES = EXAMPLE.splitlines()
FIELD_LINES = [i for i, line in enumerate(LINES) if re.match(r"^[a-z_]+ = ", line)]
REQUESTER = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"

# TOML values of every type, edge and size a field might be given instead of the right one.
VALUES = [
    "-1", "0", "1", "2", "1024", "1025", "99999999999999999999999999999", "-9223372036854775808", "1e400",
    "-1e400", "nan", "inf", "-inf", "0.1234567890123456789", "1e-30", "1e70", "true", "false", "[]", "[1, 2]",
    "{}", "{a = 1}", "1979-05-27T07:32:00Z", "07:32:00", '""', '"x"', '"self"', '"-1"', '"1e-19"', '"1e30"',
    '"1e70"', '"1_0"', '"  1 "', '"0x1234"', '"0x' + "g" * 64 + '"', '"0x' + "ab" * 32 + '"', '"0x' + "AB" * 20 + '"',
    '"日本語のモデル"', '"\\u0000"', '"a\\nb"', '"\\u202e"', '"' + "z" * 5000 + '"', "'literal'", '"""multi\nline"""',
]
KEYS = ["arbiter", "quorum", "stalenes", "tokenizer", "chat_template", "日本", '"a\\nb"', '"\\u0007"', '"x.y"',
        '""', "job.extra"]
TASKS = ["no-such-task", "gym:no-such-dataset", "/nonexistent/tasks.jsonl", "ADDITION-2DIGIT", "addition-2digit ",
         "タスク", "gym:", ".jsonl", "a\\u0000.jsonl", "../" * 40 + "x.jsonl"]
ALPHABET = '[]{}=".,#\n \t abcxyz0123456789_-+eE:\'\\/\u00e9\u4e2d\U0001f600\x00\x7f'


def garbage_bytes(rng: random.Random) -> bytes:
    return rng.randbytes(rng.randrange(0, 400))


def toml_soup(rng: random.Random) -> bytes:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(0, 300))).encode("utf-8", "surrogatepass")


def wrong_value(rng: random.Random) -> bytes:
    lines = list(LINES)
    index = rng.choice(FIELD_LINES)
    name = lines[index].split(" = ")[0]
    lines[index] = f"{name} = {rng.choice(VALUES)}"
    return "\n".join(lines).encode()


def missing_field(rng: random.Random) -> bytes:
    lines = list(LINES)
    del lines[rng.choice(FIELD_LINES)]
    return "\n".join(lines).encode()


def extra_field(rng: random.Random) -> bytes:
    return (EXAMPLE + f"\n{rng.choice(KEYS)} = {rng.choice(VALUES)}\n").encode()


def bad_task(rng: random.Random) -> bytes:
    task = rng.choice(TASKS)
    return EXAMPLE.replace('task = "addition-2digit"', f'task = "{task}"').encode()


def unknown_model(rng: random.Random) -> bytes:
    model = rng.choice(["llama-9000", "EMBEDDED", "embedded ", "モデル", "x" * 300, "\\u0000"])
    return EXAMPLE.replace('model = "embedded"', f'model = "{model}"').encode()


def deep_nesting(rng: random.Random) -> bytes:
    depth = rng.choice([10, 100, 1000, 10_000])
    opener, closer = rng.choice([("[", "]"), ("{a = ", "}")])
    return (EXAMPLE + f"\nnested = {opener * depth}1{closer * depth}\n").encode()


def not_a_table(rng: random.Random) -> bytes:
    return rng.choice([b"job = 5\n", b"[[job]]\nmodel = 'embedded'\n", b'job = "x"\n', b"", b"[job]\n",
                       EXAMPLE.replace("[job]", "[job]\n[job]").encode()])


def oversized(rng: random.Random) -> bytes:
    return (EXAMPLE + "\n# " + "x" * (MAX_SPEC_BYTES + rng.randrange(1, 1000)) + "\n").encode()


def flipped_bytes(rng: random.Random) -> bytes:
    raw = bytearray(EXAMPLE.encode())
    for _ in range(rng.randrange(1, 8)):
        raw[rng.randrange(len(raw))] = rng.randrange(256)
    return bytes(raw)


MUTATIONS: list[Callable[[random.Random], bytes]] = [
    garbage_bytes, toml_soup, wrong_value, wrong_value, wrong_value, missing_field, extra_field, bad_task,
    unknown_model, deep_nesting, not_a_table, flipped_bytes, flipped_bytes,
]


@functools.cache
def factory() -> Contract:
    return Web3().eth.contract(abi=load_artifact("JobFactory").abi)


def load_and_check(path: Path) -> JobSpecFile:
    """What `rollnet job deploy` does with the file before it contacts the chain, and the call it then
    encodes (offline here): every value must fit its Solidity type."""
    spec = load_job_spec(path)
    check_workable(spec, str(path))
    factory().encode_abi("validateSpec", args=[spec.to_abi(REQUESTER)])
    spec.lease_cost_wei()
    return spec


def assert_one_line_refusal(path: Path, data: bytes) -> bool:
    """True when refused with one clean line, False when accepted; any other exception fails the test."""
    path.write_bytes(data)
    try:
        load_and_check(path)
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message and "\r" not in message, (data[:300], message)
        assert len(message) < 1500, (data[:300], message[:300])
        assert str(path) in message, (data[:300], message)  # the refusal names the file
        return True
    except Exception as exc:  # noqa: BLE001 - the point: nothing else may escape
        pytest.fail(f"{type(exc).__name__}: {exc} for spec bytes {data[:300]!r}")
    return False


def test_mutated_specs_are_refused_in_one_line(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    path = tmp_path / "job.toml"
    refused = sum(assert_one_line_refusal(path, rng.choice(MUTATIONS)(rng)) for _ in range(ITERATIONS))
    assert refused > ITERATIONS * 0.7, refused  # the mutations are mistakes, mostly


@pytest.mark.parametrize("mutation", [oversized, deep_nesting, not_a_table, bad_task, unknown_model],
                         ids=lambda m: m.__name__)
def test_each_kind_of_mistake(mutation: Callable[[random.Random], bytes], tmp_path: Path) -> None:
    rng = random.Random(SEED)
    for _ in range(6):
        data = mutation(rng)
        assert assert_one_line_refusal(tmp_path / "job.toml", data), data[:200]


def test_what_is_not_a_spec_file(tmp_path: Path) -> None:
    for path, pattern in [(tmp_path / "missing.toml", "does not exist"), (tmp_path, "is not a file")]:
        with pytest.raises(ConfigError, match=pattern):
            load_job_spec(path)
    (tmp_path / "folder.jsonl").mkdir()
    spec = tmp_path / "job.toml"
    spec.write_text(EXAMPLE.replace('task = "addition-2digit"', f'task = "{tmp_path / "folder.jsonl"}"'))
    with pytest.raises(ConfigError, match="field 'task': cannot read task file"):
        load_and_check(spec)


def test_the_example_and_a_lower_case_trainer_pass(tmp_path: Path) -> None:
    load_and_check(REPO / "examples" / "job.toml")
    spec = tmp_path / "job.toml"
    spec.write_text(EXAMPLE.replace('trainer = "self"', f'trainer = "{REQUESTER.lower()}"'))
    assert load_and_check(spec).trainer == REQUESTER


CLI_SPECS = {
    "garbage bytes": garbage_bytes, "toml soup": toml_soup, "unknown task": bad_task, "unknown model": unknown_model,
    "a control character in a key": lambda rng: (EXAMPLE + '\n"a\\nb\\u0007" = 1\n').encode(),
    "a huge number": lambda rng: EXAMPLE.replace("group_size = 8", "group_size = 1" + "0" * 40).encode(),
    "deep nesting": lambda rng: (EXAMPLE + "\nx = " + "[" * 5000 + "]" * 5000 + "\n").encode(),
    "oversized": oversized,
}


def test_deploy_refuses_them_in_one_line(tmp_path: Path) -> None:
    """`rollnet job deploy --spec` on a dead chain: the spec is refused first, so the chain is never asked."""
    rng = random.Random(SEED)
    cases, jobs = [], []
    for i, (name, mutation) in enumerate(CLI_SPECS.items()):
        path = tmp_path / f"spec-{i}.toml"
        path.write_bytes(mutation(rng))
        case = Case(f"deploy: {name}", ["--rpc-url", DEAD_RPC, "job", "deploy", "--spec", str(path), "--budget", "5",
                                        "--dev-account", "0"], "runtime", re.escape(str(path)))
        cases.append(case)
        jobs.append(prepare(case, tmp_path / f"home-{i}"))
    for case, result in zip(cases, run_forked(jobs, tmp_path), strict=True):
        check(case, result)
        assert "no Ethereum node answers" not in result.stderr, (case.id, result.stderr)
