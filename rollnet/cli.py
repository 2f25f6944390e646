"""The `rollnet` command: composes each role package's sub-commands and prints user errors as one line.

Invariant: a RollnetError (user mistake or environment problem) exits 1 with `error: <message>` on
stderr and no traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.markup import escape

from rollnet.devnet import devnet
from rollnet.node.cli import budget_cmd, chain_cmd, job_cmd, keys_cmd, model_cmd, node_cmd, rollout_cmd
from rollnet.node.cli.context import CliContext, configure_logging, make_console
from rollnet.node.errors import RollnetError
from rollnet.trainer import cli as trainer_cli
from rollnet.validator import cli as validator_cli

app = typer.Typer(
    name="rollnet",
    help="rollnet: a permissionless compute market for RL post-training.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(keys_cmd.app, name="keys")
app.add_typer(chain_cmd.app, name="chain")
app.add_typer(node_cmd.app, name="node")
app.add_typer(job_cmd.app, name="job")
app.add_typer(model_cmd.app, name="model")
app.add_typer(rollout_cmd.app, name="rollout")
app.add_typer(trainer_cli.app, name="trainer")
app.add_typer(validator_cli.app, name="validator")
app.command("devnet")(devnet)
app.command("budget")(budget_cmd.budget)


@app.callback()
def common(
    ctx: typer.Context,
    data_dir: Path = typer.Option(None, "--data-dir", envvar="ROLLNET_HOME", help="node state (default ~/.rollnet)"),
    rpc_url: str = typer.Option(None, "--rpc-url", envvar="ROLLNET_RPC_URL", help="chain JSON-RPC endpoint"),
    log_level: str = typer.Option("warning", "--log-level", help="debug, info, warning or error"),
) -> None:
    configure_logging(log_level)
    ctx.obj = CliContext(data_dir_option=data_dir, rpc_url_option=rpc_url)


def main(argv: list[str] | None = None) -> int:
    err = make_console(stderr=True)
    try:
        # In non-standalone mode click returns a command's `typer.Exit(code)` instead of raising it.
        code = app(args=argv, standalone_mode=False)
    except RollnetError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except typer.Abort:
        err.print("aborted")
        return 1
    except typer.Exit as exc:
        return exc.exit_code
    except Exception as exc:  # click usage errors arrive here in non-standalone mode
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            return exc.exit_code
        raise
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
