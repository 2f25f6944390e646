"""The devnet's live terminal view: one rich table of the run, redrawn from `RunState`.

Invariant: rendering only reads the state; it never waits on a participant or the chain.
"""

from __future__ import annotations

import time

from rich.console import Group
from rich.table import Table
from rich.text import Text

from rollnet.devnet.observe import RunState
from rollnet.node.units import format_eth


def render(state: RunState, started: float, steps: int, budget: int, alive: dict[str, bool]) -> Group:
    chain = state.chain
    trained = state.steps()
    held = state.held_out()
    last = trained[-1] if trained else None
    broadcasts = [b for b in state.broadcasts() if last and b["version"] == last["version"]]
    header = Table.grid(padding=(0, 2))
    header.add_row(
        f"[bold]{time.time() - started:5.0f} s[/]",
        f"step [bold]{len(trained)}/{steps}[/]",
        f"chain version [bold]{chain.version}[/] (block {chain.block})",
        f"sampled reward [bold]{last['reward']:.3f}[/]" if last else "sampled reward -",
        f"held-out {held[0]['accuracy']:.3f} → [bold]{held[-1]['accuracy']:.3f}[/]" if held else "held-out -",
    )
    header.add_row(
        f"delta {last['delta_bytes'] or 0:,} B" if last else "delta -",
        f"broadcast {max(b['broadcast_s'] for b in broadcasts):.2f} s" if broadcasts else "broadcast -",
        f"accepted {chain.decided['accepted']}  rejected {chain.decided['rejected']}  "
        f"slashed {sum(1 for v in chain.slashed.values() if v)}",
        f"escrow {format_eth(chain.escrow)}",
        f"staleness budget {budget}",
    )
    table = Table(expand=False)
    for column in ("participant", "state", "policy", "staleness g (samples)", "submitted", "verdicts",
                   "stake", "earned"):
        table.add_column(column, justify="left" if column in ("participant", "state") else "right")
    by_worker = state.staleness_by_worker()
    for person in state.people.values():
        submits = person.of("submit")
        verdicts = person.of("verdict")
        histogram = by_worker.get(person.name)
        table.add_row(
            f"{person.name}",
            "[green]running[/]" if alive.get(person.name) else "[red]stopped[/]",
            str(person.policy_version if person.role != "trainer" else (last["version"] if last else 0)),
            " ".join(f"{g}:{n}" for g, n in sorted(histogram.items())) if histogram else "",
            str(len(submits)) if person.role in ("worker", "cheater") else "",
            (f"{sum(v['accept'] for v in verdicts)}✓ {sum(not v['accept'] for v in verdicts)}✗"
             if person.role == "validator" else ""),
            format_eth(chain.stake.get(person.name, 0)) if person.role != "trainer" else "",
            format_eth(chain.owed.get(person.name, 0) + chain.withdrawn.get(person.name, 0))
            if person.role in ("worker", "cheater") else "",
        )
    return Group(header, table, Text("Ctrl-C stops every process; the run directory keeps everything.",
                                     style="dim"))
