"""The wheel carries every module of node/, validator/ and trainer/ under the rollnet namespace."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import REPO

ROLE_FOLDERS = ("node", "validator", "trainer")


def test_wheel_contains_every_module(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path),
         str(REPO)],
        check=True,
    )
    (wheel,) = tmp_path.glob("rollnet-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"rollnet/{m.relative_to(REPO / 'rollnet').as_posix()}" for m in (REPO / "rollnet").rglob("*.py")}
    assert "rollnet/devnet/network.py" in expected
    for folder in ROLE_FOLDERS:
        for module in (REPO / folder).rglob("*.py"):
            expected.add(f"rollnet/{module.relative_to(REPO).as_posix()}")
    assert len(expected) > 20
    missing = sorted(expected - names)
    assert not missing, f"modules missing from the wheel: {missing}"
    # the embedded model's reference build, which `model init` materialises
    assert {"rollnet/node/model/reference/addition-2digit.safetensors",
            "rollnet/node/model/reference/addition-2digit.json"} <= names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "rollnet = rollnet.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_node_never_imports_validator_or_trainer() -> None:
    offenders = {
        str(path.relative_to(REPO)): sorted(bad)
        for path in (REPO / "node").rglob("*.py")
        if (bad := {m for m in _imported_modules(path) if m.startswith(("rollnet.validator", "rollnet.trainer"))})
    }
    imports_seen = set().union(*(_imported_modules(p) for p in (REPO / "node").rglob("*.py")))
    assert "rollnet.node.chain.client" in imports_seen  # the scan does see our own imports
    assert offenders == {}


def test_every_rollnet_command_in_docker_compose_parses(capsys: pytest.CaptureFixture) -> None:
    """The compose file's services run real `rollnet` commands with options that exist; where Debian's
    docker-compose is installed, it accepts the file without an engine."""
    import shutil
    import subprocess

    import yaml

    from rollnet.cli import main

    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"chain", "deployer", "requester", "trainer", "worker", "validator"} <= set(services)
    assert services["worker"]["deploy"]["replicas"] >= 2
    commands = [s["command"] for s in services.values() if s["command"][0] == "rollnet"]
    assert len(commands) == 3
    for command in commands:
        assert main([*command[1:], "--help"]) == 0, command
    capsys.readouterr()
    if shutil.which("docker-compose"):
        subprocess.run(["docker-compose", "-f", str(REPO / "docker-compose.yml"), "config", "-q"], check=True,
                       cwd=REPO)


LIGHT_COMMANDS = (["keys", "--help"], ["chain", "--help"], ["node", "join", "--help"], ["node", "status", "--help"],
                  ["job", "status", "--help"], ["job", "deploy", "--help"], ["budget", "--help"])
HEAVY_MODULES = ("torch", "transformers", "safetensors", "vllm", "rollnet.trainer", "rollnet.validator")


@pytest.mark.parametrize("argv", LIGHT_COMMANDS, ids=" ".join)
def test_account_and_chain_commands_never_load_the_model_stack(argv: list[str]) -> None:
    """`rollnet keys|chain|node join|job …` import only their own sub-command (rollnet.cli's SUBCOMMANDS): a
    requester or a staker waits for no torch import, and the commands still parse and print their help."""
    probe = (f"import sys\nfrom rollnet.cli import main\ncode = main({argv!r})\n"
             f"loaded = sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules)\n"
             "print('LOADED', loaded, 'CODE', code)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert "Usage: " in result.stdout and "[OPTIONS]" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "LOADED [] CODE 0", result.stdout[-500:]


def test_every_subcommand_loads_and_the_root_lists_them_in_order(capsys: pytest.CaptureFixture) -> None:
    """The lazy root knows every sub-command by name before loading it, and loads each one on demand."""
    import typer

    from rollnet.cli import SUBCOMMANDS, app, load_every_command, load_subcommand, main
    root = typer.main.get_command(app)
    assert list(root.commands) == list(SUBCOMMANDS)
    load_every_command()
    for name in SUBCOMMANDS:
        assert load_subcommand(name).name == name
    assert main(["--help"]) == 0
    listed = [line.split()[1] for line in capsys.readouterr().out.splitlines()
              if line.startswith("│ ") and line.split()[1] in SUBCOMMANDS]
    assert listed == list(SUBCOMMANDS)


def test_a_sub_command_that_fails_to_load_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyError raised while a sub-command's module loads is a bug, not "no such command": it is not swallowed
    by click's `commands.get()`."""
    import rollnet.cli as cli

    def broken(name: str) -> None:
        raise KeyError("ROLLNET_SETTING")

    monkeypatch.setattr(cli, "load_subcommand", broken)
    with pytest.raises(RuntimeError, match=r"loading `rollnet keys` failed: KeyError 'ROLLNET_SETTING'"):
        cli.main(["keys", "--help"])
    assert "keys" in cli.LazyCommands()  # known by name without loading
