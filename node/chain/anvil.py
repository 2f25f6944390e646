"""Start and stop a local Anvil chain for the embedded default.

Invariants: Anvil listens on 127.0.0.1 only, on a free port unless one is given; `start` returns only
once the node answers eth_chainId; we run the platform binary itself (never the npm launcher, whose
death would orphan anvil), so stopping our process handle stops the chain.
"""

from __future__ import annotations

import os
import platform
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import requests
from rollnet.node.errors import ChainUnavailable, ConfigError, RollnetError

DEV_MNEMONIC = "test test test test test test test test test test test junk"
DEFAULT_CHAIN_ID = 31337


def anvil_binary() -> Path:
    """The anvil executable: ROLLNET_ANVIL, else the npm platform package, else PATH."""
    if os.environ.get("ROLLNET_ANVIL"):
        return Path(os.environ["ROLLNET_ANVIL"])
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine().lower())
    system = platform.system().lower()
    repo = Path(__file__).resolve().parents[2]
    candidate = repo / "node_modules" / "@foundry-rs" / f"anvil-{system}-{arch}" / "bin" / "anvil"
    if candidate.exists():
        return candidate
    found = shutil.which("anvil")
    if found:
        return Path(found)
    raise ConfigError(f"anvil not found (looked at {candidate} and PATH): run `make setup`")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_until_answering(url: str, timeout: float = 15.0) -> int:
    """Poll eth_chainId until it answers; return the chain id."""
    deadline = time.monotonic() + timeout
    payload = {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}
    while True:
        try:
            return int(requests.post(url, json=payload, timeout=1.0).json()["result"], 16)
        except (requests.RequestException, ValueError, KeyError):
            if time.monotonic() > deadline:
                raise ChainUnavailable(f"anvil did not answer at {url} within {timeout:.0f}s") from None
            time.sleep(0.05)


@dataclass
class AnvilProcess:
    """A running anvil; `stop()` ends it."""

    pid: int
    port: int
    chain_id: int
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def mine_every(self, seconds: int) -> None:
        """From now on, a block every `seconds` (as `--block-time`) and none per transaction: a setup mined at
        once, then an L2's cadence for what follows."""
        if seconds < 1:
            raise ConfigError("a block interval is at least one second")
        payload = {"jsonrpc": "2.0", "id": 1, "method": "evm_setIntervalMining", "params": [seconds]}
        try:
            answer = requests.post(self.url, json=payload, timeout=10.0).json()
        except (requests.RequestException, ValueError) as exc:
            raise ChainUnavailable(f"anvil at {self.url} did not take the block interval: {exc}") from None
        if not isinstance(answer, dict) or "error" in answer:
            refusal = answer.get("error") if isinstance(answer, dict) else answer
            raise RollnetError(f"the node at {self.url} refused a block interval (is it anvil?): {refusal}")

    def stop(self, timeout: float = 5.0) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            return
        stop_pid(self.pid, timeout)


def start_anvil(
    port: int | None = None,
    chain_id: int = DEFAULT_CHAIN_ID,
    accounts: int = 20,
    balance_eth: int = 10_000,
    log_path: Path | None = None,
    detach: bool = False,
    extra_args: list[str] | None = None,
) -> AnvilProcess:
    """Start anvil on 127.0.0.1 and wait until it answers.

    `detach=True` puts it in its own session so it outlives this process (`rollnet chain up`).
    """
    if port is not None and not port_is_free(port):
        raise ConfigError(f"port {port} on 127.0.0.1 is already in use: pick another --port or omit it")
    port = port or free_port()
    command = [
        str(anvil_binary()), "--host", "127.0.0.1", "--port", str(port), "--chain-id", str(chain_id),
        "--accounts", str(accounts), "--balance", str(balance_eth), "--mnemonic", DEV_MNEMONIC,
        *(extra_args or []),
    ]
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=detach
        )
    finally:
        if log_path:
            log.close()  # type: ignore[union-attr]
    node = AnvilProcess(pid=process.pid, port=port, chain_id=chain_id, process=process)
    try:
        wait_until_answering(node.url)
    except ChainUnavailable:
        node.stop()
        raise
    return node


def stop_pid(pid: int, timeout: float = 5.0) -> bool:
    """Terminate a detached anvil by pid; True if it was running. Never touches a pid that is not anvil."""
    try:
        if "anvil" not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
            return False
    except OSError:
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
        except ChildProcessError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    return True
