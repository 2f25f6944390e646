"""A lone libp2p host in its own process, driven over stdin: the target of robustness tests and benchmarks.

`python -m rollnet.node.p2p.standalone DATA_DIR [--topic T]` starts a P2PNode on 127.0.0.1 with no stake
gate (the worst case: every peer may speak every protocol, as a staked attacker could), subscribes to the
given gossip topics and prints one JSON line {"peer_id", "addr", "pid"}. Then each stdin line is a command
answered by one JSON line on stdout:
  put SIZE SEED   -> {"root": hex}  a deterministic object of SIZE bytes, stored and served
  stats           -> {"alive", "rss_kib", "fds", "connected", "restarts", "faults", "refused", "gossip"}
  protocols       -> {"protocols": [id, ...]}  every protocol the host answers
  connect ADDR    -> {"connected": [peer id, ...]}
End of input stops the host and the process; `StandaloneProcess` starts one and speaks this protocol.
Invariant: nothing read from the network can end this process before stdin does (that is what it
exists to show); a command it cannot parse is answered with an "error".
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import trio
from rollnet.node.p2p.discipline import PeerDiscipline
from rollnet.node.p2p.host import P2PNode
from rollnet.node.p2p.identity import load_or_create_identity
from rollnet.node.p2p.objects import ObjectStore


def resident_kib(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0

def open_fds(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))

def answer(value: dict) -> None:
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()

class StandaloneProcess:
    """Starts `python -m rollnet.node.p2p.standalone` and speaks its stdin/stdout commands."""

    def __init__(self, data_dir: Path, *, topics: list[str] = (), ban_threshold: int = 10):
        command = [sys.executable, "-m", "rollnet.node.p2p.standalone", str(data_dir),
                   "--ban-threshold", str(ban_threshold)]
        for topic in topics:
            command += ["--topic", topic]
        self.data_dir = data_dir
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})
        hello = self._read()
        self.peer_id: str = hello["peer_id"]
        self.addr: str = hello["addr"]

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the standalone host ended (exit code {self.process.poll()})")
        return json.loads(line)

    def ask(self, command: str) -> dict:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self._read()

    def put(self, size: int, seed: int) -> bytes:
        return bytes.fromhex(self.ask(f"put {size} {seed}")["root"])

    def stats(self) -> dict:
        return self.ask("stats")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


async def send_raw(node: P2PNode, peer: str, protocol: str, payload: bytes, reset: bool = False) -> None:
    """From `node`, open a `protocol` stream to `peer`, write raw `payload`, then read a little (or reset at
    once). Every failure is swallowed: refusals are what an attacker gets (run it with `node.call`)."""
    try:
        stream = await node.open_stream(peer, protocol)
    except Exception:  # noqa: BLE001 - refused at negotiation, or banned
        return
    try:
        await stream.write(payload)
        if reset:
            await stream.reset()
            return
        with trio.move_on_after(1):
            await stream.read(64)
    except Exception:  # noqa: BLE001 - the target is expected to reset us
        pass
    finally:
        with trio.move_on_after(1):
            try:
                await stream.close()
            except Exception:  # noqa: BLE001
                pass


def serve(node: P2PNode) -> None:
    gossip = 0
    for line in sys.stdin:
        words = line.split()
        try:
            if words[:1] == ["put"]:
                size, seed = int(words[1]), int(words[2])
                answer({"root": node.store.put(random.Random(seed).randbytes(size)).hex()})
            elif words[:1] == ["stats"]:
                while not node.gossip_inbox.empty():
                    node.gossip_inbox.get_nowait()
                    gossip += 1
                answer({"alive": node.alive, "rss_kib": resident_kib(), "fds": open_fds(),
                        "connected": len(node.connected_peers()) if node.alive else -1,
                        "restarts": node.stats.restarts, "faults": sum(node.stats.faults.values()),
                        "refused": sum(node.stats.refused.values()), "gossip": gossip})
            elif words[:1] == ["protocols"]:
                answer({"protocols": node.protocols()})
            elif words[:1] == ["connect"]:
                answer({"connected": node.connect(words[1:])})
            else:
                answer({"error": f"unknown command {line.strip()!r}"})
        except (IndexError, ValueError) as exc:
            answer({"error": f"bad command {line.strip()!r}: {exc}"})

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--topic", action="append", default=[])
    parser.add_argument("--ban-threshold", type=int, default=10)
    args = parser.parse_args(argv)

    args.data_dir.mkdir(parents=True, exist_ok=True)
    node = P2PNode(load_or_create_identity(args.data_dir), ObjectStore(args.data_dir / "objects"), gate=None,
                   discipline=PeerDiscipline(threshold=args.ban_threshold)).start()
    try:
        for topic in args.topic:
            node.subscribe(topic)
        answer({"peer_id": node.peer_id, "addr": node.addr, "pid": os.getpid()})
        serve(node)
    finally:
        node.stop()
    return 0

if __name__ == "__main__":
    sys.exit(main())
