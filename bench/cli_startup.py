"""How long a `rollnet` command takes to start: each sub-command loaded on first use, against all loaded at once.

Each command runs `--help` in a fresh interpreter, three times per arm (once with --quick), interleaved so both
arms see the same machine:
- lazy: `rollnet.cli.main()` on `CMD --help`, as the console script runs it (rollnet.cli imports only the named
  sub-command's module);
- eager: the same, after `rollnet.cli.load_every_command()` has imported every sub-command (torch,
  transformers, the trainer and the validator included), as `rollnet` started before the lazy root.
The table reports the median wall seconds per arm and their ratio. `--help` parses the command line and builds
the whole command, so what it measures is the start-up every invocation pays before its own work.

Usage: python bench/cli_startup.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = (("keys", "new"), ("chain", "up"), ("node", "join"), ("job", "status"), ("node", "work"),
            ("trainer", "run"))
EAGER = "import sys\nfrom rollnet.cli import load_every_command, main\nload_every_command()\nsys.exit(main())"
LAZY = "import sys\nfrom rollnet.cli import main\nsys.exit(main())"


def seconds(program: str, argv: tuple[str, ...]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", program, *argv, "--help"], check=True, capture_output=True, timeout=300)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one command (keys new), one run per arm")
    parser.add_argument("--json", type=Path, default=Path("bench/results/cli_startup.json"))
    args = parser.parse_args()
    from rich.table import Table
    from rollnet.node.cli.context import make_console

    console = make_console()
    commands, repeats = (COMMANDS[:1], 1) if args.quick else (COMMANDS, 3)
    rows = []
    for command in commands:
        lazy, eager = [], []
        for _ in range(repeats):
            lazy.append(seconds(LAZY, command))
            eager.append(seconds(EAGER, command))
        rows.append({"command": " ".join(command), "lazy_s": statistics.median(lazy),
                     "eager_s": statistics.median(eager)})
        rows[-1]["eager_over_lazy"] = rows[-1]["eager_s"] / rows[-1]["lazy_s"]
    table = Table(title=f"`rollnet CMD --help` wall seconds, fresh interpreter, median of {repeats}")
    for column in ("command", "lazy (this root)", "eager (all loaded)", "eager / lazy"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(row["command"], f"{row['lazy_s']:.2f}", f"{row['eager_s']:.2f}", f"{row['eager_over_lazy']:.1f}x")
    console.print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"benchmark": "cli_startup", "quick": args.quick, "repeats": repeats,
                                     "rows": rows}, indent=2))
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
