"""Broadcasting a policy delta to N workers: star (the seed uploads to everyone) against our swarm (every
peer serves the chunks it has), with every peer's upload capped by a token bucket so loopback behaves like
a WAN; plus one peer-to-peer transfer against a plain TCP socket.

One OS process per peer, real libp2p hosts (Noise + yamux) on 127.0.0.1. Bounds: binary tree
(size / rate x ceil(log2(N + 1))) and, with chunk pipelining, size / rate.

Usage: python bench/broadcast.py [--quick] [--json PATH] [--rate MB/s] [--size MB]
Invariant: every time is measured from the moment the fetch command is sent to the last receiver's
verified, complete object; nothing is simulated.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MB = 1_000_000
WARM_UP_BYTES = 256 * 1024  # one chunk each peer fetches before anything is timed


# ---------------------------------------------------------------------------------------------- peer process

def peer_main(data_dir: Path, rate: float | None) -> None:
    """A peer driven by stdin commands, answering with JSON lines on stdout."""
    from rollnet.node.p2p.host import P2PNode
    from rollnet.node.p2p.identity import load_or_create_identity
    from rollnet.node.p2p.objects import ObjectStore

    def say(**event: object) -> None:
        print(json.dumps(event), flush=True)

    node = P2PNode(load_or_create_identity(data_dir), ObjectStore(data_dir / "objects"), gate=None,
                   upload_rate=rate, max_uploads=32, per_peer_streams=16).start()
    say(event="ready", addr=node.addr, peer=node.peer_id)
    for line in sys.stdin:
        command, *args = line.split()
        if command == "connect":
            say(event="connected", peers=len(node.connect(args)))
        elif command == "put":
            root = node.store.put(os.urandom(int(args[0])))
            say(event="root", root=root.hex())
        elif command == "fetch":
            started = time.perf_counter()
            per_provider, batch = (int(args[2]), int(args[3])) if len(args) > 3 else (2, 2)
            report = node.fetch(bytes.fromhex(args[0]), args[1].split(","), per_provider=per_provider, batch=batch)
            say(event="fetched", seconds=time.perf_counter() - started, by_provider=report.by_provider)
        elif command == "quit":
            say(event="bye", max_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
            break
    node.stop()


class Peer:
    def __init__(self, folder: Path, rate: float | None):
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--peer", str(folder)] + (["--peer-rate", str(rate)] if rate else []),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        self.addr = self.peer = ""

    def wait_ready(self) -> Peer:
        ready = self.expect("ready")
        self.addr, self.peer = ready["addr"], ready["peer"]
        return self

    def send(self, line: str) -> None:
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def expect(self, event: str) -> dict:
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"peer exited while waiting for {event}")
            message = json.loads(line)
            if message.get("event") == event:
                return message

    def quit(self) -> float:
        """Ask the peer to stop; its largest RSS (MB), or 0 if it had died (it is killed, the run's error stands)."""
        try:
            self.send("quit")
            rss = self.expect("bye")["max_rss_mb"]
            self.process.wait(10)
            return rss
        except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
            return 0.0


# ---------------------------------------------------------------------------------------------- runs

def broadcast(n: int, size: int, rate: float | None, modes: tuple[str, ...] = ("star", "swarm"),
              pipeline: tuple[int, int] = (2, 2)) -> tuple[dict[str, float], float]:
    """Seconds until all n receivers hold a fresh object, for each of `modes` in turn on the same peers ("star":
    from the seed only; "swarm": from the seed and every other receiver), and the largest peer RSS (MB)."""
    with tempfile.TemporaryDirectory() as folder:
        started_up = [Peer(Path(folder) / f"peer{i}", rate) for i in range(n + 1)]  # they start up together
        seconds: dict[str, float] = {}
        try:
            peers = [peer.wait_ready() for peer in started_up]
            seed, receivers = peers[0], peers[1:]
            for index, peer in enumerate(receivers):
                others = [seed.addr] + [p.addr for p in receivers[index + 1:]]
                peer.send("connect " + " ".join(others))
                peer.expect("connected")
            # An untimed warm-up, from every provider: each process's first fetch (its streams, lazy imports) is
            # paid here, not by whichever mode is timed first.
            for mode in ("warm-up", *modes):
                seed.send(f"put {WARM_UP_BYTES if mode == 'warm-up' else size}")
                root = seed.expect("root")["root"]
                started = time.perf_counter()
                for peer in receivers:
                    others = [p.peer for p in receivers if p is not peer] if mode != "star" else []
                    peer.send(f"fetch {root} {','.join([seed.peer, *others])} {pipeline[0]} {pipeline[1]}")
                for peer in receivers:
                    peer.expect("fetched")
                seconds[mode] = time.perf_counter() - started
        finally:
            rss = max(peer.quit() for peer in started_up)
    seconds.pop("warm-up", None)
    return seconds, rss


def raw_tcp_mb_s(size: int) -> float:
    """Plain TCP between two processes on loopback, the same bytes in 1 MiB writes."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    sender = subprocess.Popen([sys.executable, "-c", (
        "import socket,sys\n"
        f"s=socket.create_connection(('127.0.0.1',{port})); chunk=b'x'*(1<<20); left={size}\n"
        "while left>0:\n    n=min(left,len(chunk)); s.sendall(chunk[:n]); left-=n\n"
        "s.close()\n")])
    connection, _ = listener.accept()
    started = time.perf_counter()
    received = 0
    while True:
        data = connection.recv(1 << 20)
        if not data:
            break
        received += len(data)
    elapsed = time.perf_counter() - started
    sender.wait()
    connection.close()
    listener.close()
    assert received == size
    return size / elapsed / MB


def main() -> None:
    parser = argparse.ArgumentParser(description="Swarm broadcast against star, and raw transfer speed.")
    parser.add_argument("--quick", action="store_true", help="16 MB, N = 2 and 4")
    parser.add_argument("--json", type=Path, default=Path("bench/results/broadcast.json"))
    parser.add_argument("--rate", type=float, default=20.0, help="per-peer upload cap, MB/s")
    parser.add_argument("--size", type=float, default=None, help="object size, MB (default 64, quick 16)")
    parser.add_argument("--peer", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--peer-rate", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        peer_main(args.peer, args.peer_rate)
        return

    from rich.table import Table
    from rollnet.node.cli.context import make_console

    console = make_console()
    size = int((args.size or (16 if args.quick else 64)) * MB)
    rate = args.rate * MB
    runs = []
    for n in (2, 4) if args.quick else (2, 4, 8):
        seconds, rss = broadcast(n, size, rate)
        star, swarm = seconds["star"], seconds["swarm"]
        tree = size / rate * math.ceil(math.log2(n + 1))
        runs.append({"n": n, "star_s": star, "swarm_s": swarm, "bound_s": tree, "pipelined_bound_s": size / rate,
                     "speedup_vs_star": star / swarm, "swarm_over_bound": swarm / tree,
                     "max_peer_rss_mb": rss})
        console.print(f"N={n}: star {star:.1f}s, swarm {swarm:.1f}s")
    single = broadcast(1, 64 * MB, None, modes=("star",), pipeline=(4, 16))[0]["star"]
    single_mb_s = 64 * MB / single / MB
    tcp = raw_tcp_mb_s(64 * MB)

    table = Table(title=f"{size / MB:.0f} MB to N receivers, every peer's upload capped at {args.rate:g} MB/s")
    for column in ("N", "star s", "swarm s", "tree bound s", "pipelined bound s", "swarm vs star",
                   "swarm / tree bound", "max RSS MB"):
        table.add_column(column, justify="right")
    for run in runs:
        table.add_row(str(run["n"]), f"{run['star_s']:.2f}", f"{run['swarm_s']:.2f}", f"{run['bound_s']:.2f}",
                      f"{run['pipelined_bound_s']:.2f}", f"{run['speedup_vs_star']:.2f}x",
                      f"{run['swarm_over_bound']:.2f}", f"{run['max_peer_rss_mb']:.0f}")
    console.print(table)
    console.print(f"single transfer (no cap, Noise + yamux): {single_mb_s:.0f} MB/s; raw TCP: {tcp:.0f} MB/s "
                  f"({tcp / single_mb_s:.1f}x)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"benchmark": "broadcast", "quick": args.quick, "size_bytes": size,
                                     "rate_bytes_per_s": rate, "runs": runs, "single_transfer_mb_s": single_mb_s,
                                     "raw_tcp_mb_s": tcp}, indent=2))
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
