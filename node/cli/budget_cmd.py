"""`rollnet budget`: predict broadcast time and staleness g = B / S for a model, link and step time.

Invariant: the numbers come from `rollnet.node.budget` alone (pure arithmetic, no chain or network),
and bad input is one clear line.
"""

from __future__ import annotations

import typer
from rich.table import Table
from rollnet.node.budget import LINKS, MODELS, format_bytes, parse_duration, parse_params, parse_rate, predict
from rollnet.node.cli.context import console


def budget(
    params: str = typer.Option("8B", "--params", help="model size, e.g. 8B or 135M"),
    link: str = typer.Option("1gbps", "--link", help="per-peer link rate, e.g. 100mbps, 1gbps"),
    sparse: bool = typer.Option(True, "--sparse/--full", help="sparse deltas (default) or full bf16 weights"),
    change: float = typer.Option(0.01, "--change", help="fraction of elements changed per step, in (0, 1]",
                                 min=0, max=1),
    step_time: str = typer.Option("30s", "--step-time", help="trainer step time S"),
    budget_steps: float = typer.Option(4.0, "--budget", help="staleness the loss absorbs, in steps", min=0),
    overhead: float = typer.Option(1.0, "--overhead", help="broadcast tree time over the ideal (>= 1)", min=1),
    table: bool = typer.Option(False, "--table", help="g for models 1B-70B over links 100 Mbps-100 Gbps"),
) -> None:
    """Will a worker's policy land within the staleness budget? B = payload / link, g = B / S."""
    step_s = parse_duration(step_time)
    if table:
        grid = Table(title=f"staleness g ({'sparse deltas' if sparse else 'full bf16'}, change {change:.2%}, "
                           f"step {step_s:g} s, budget {budget_steps:g}; red: over budget)")
        grid.add_column("model")
        for name in LINKS:
            grid.add_column(name, justify="right")
        for model in MODELS:
            cells = []
            for name in LINKS:
                p = predict(parse_params(model), parse_rate(name), sparse=sparse, change=change, step_s=step_s,
                            budget=budget_steps, overhead=overhead)
                cells.append(f"[{'green' if p.fits else 'red'}]{p.staleness:.3g}[/]")
            grid.add_row(model, *cells)
        console.print(grid)
        return
    p = predict(parse_params(params), parse_rate(link), sparse=sparse, change=change, step_s=step_s,
                budget=budget_steps, overhead=overhead)
    out = Table(show_header=False, title=f"{params} over {link}")
    out.add_row("payload", f"{format_bytes(p.payload_bytes)} ({'sparse delta' if sparse else 'full bf16'}; "
                           f"full weights {format_bytes(2 * p.params)})")
    out.add_row("broadcast time B", f"{p.broadcast_s:.3g} s")
    out.add_row("step time S", f"{step_s:g} s")
    out.add_row("staleness g = B / S", f"{p.staleness:.3g} steps")
    out.add_row("budget", f"{budget_steps:g} steps: " + ("[green]fits[/]" if p.fits else "[red]over budget[/]"))
    console.print(out)
