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
