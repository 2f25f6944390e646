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
        f"decided {chain.rounds['accepted']}✓ {chain.rounds['rejected']}✗  "
        f"slashed {sum(1 for v in chain.slashed.values() if v)}",
        f"escrow {format_eth(chain.escrow)}",
        f"staleness budget {budget}",
    )
    table = Table(expand=False, caption="[green]running[/] / [red]stopped[/]")
    table.add_column("participant", no_wrap=True)
    for column in ("v", "staleness g:samples", "batches", "verdicts", "stake ETH", "earned ETH"):
        table.add_column(column, justify="right")
    by_worker = state.staleness_by_worker()
    for person in state.people.values():
        histogram = by_worker.get(person.name)
        verdicts = person.of("verdict")
        colour = "green" if alive.get(person.name) else "red"
        table.add_row(
            f"[{colour}]{person.name}[/]",
            str(person.policy_version if person.role != "trainer" else (last["version"] if last else 0)),
            " ".join(f"{g}:{n}" for g, n in sorted(histogram.items())) if histogram else "",
            str(len(person.of("submit"))) if person.role in ("worker", "cheater") else "",
            (f"{sum(v['accept'] for v in verdicts)}✓ {sum(not v['accept'] for v in verdicts)}✗"
             if person.role == "validator" else ""),
            _eth(chain.stake.get(person.name, 0)) if person.role != "trainer" else "",
            _eth(chain.owed.get(person.name, 0) + chain.withdrawn.get(person.name, 0))
            if person.role in ("worker", "cheater") else "",
        )
    return Group(header, table, Text("Ctrl-C stops every process; the run directory keeps everything.",
                                     style="dim"))


def _eth(wei: int) -> str:
    return f"{wei / 10**18:.3f}".rstrip("0").rstrip(".")
