"""The `rollnet` command: composes each role package's sub-commands and prints user errors as one line.

Invariant: a usage error (an unknown command or option, a missing or malformed value; see
`rollnet.node.cli.params`) exits 2 with click's usage line and one `Error:` line; a RollnetError (user
mistake or environment problem found while running) exits 1 with one `error: <message>` line on stderr;
neither prints a traceback. Anything else is a bug and keeps its traceback. typer 0.29 vendors click and
raises its own exception classes (all `typer.TyperException`, each with its exit code and `show()`),
not click's; pyproject.toml pins the typer these handlers are written for.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.markup import escape

from rollnet.devnet import devnet
from rollnet.node.cli import budget_cmd, chain_cmd, job_cmd, keys_cmd, model_cmd, node_cmd, params, rollout_cmd
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
    data_dir: Path = typer.Option(None, "--data-dir", envvar="ROLLNET_HOME", help="node state (default ~/.rollnet)",
                                  **params.STATE_DIR),
    rpc_url: str = typer.Option(None, "--rpc-url", envvar="ROLLNET_RPC_URL", help="chain JSON-RPC endpoint",
                                **params.URL),
    log_level: str = typer.Option("warning", "--log-level", help=", ".join(params.LOG_LEVELS),
                                  **params.LEVEL),
) -> None:
    configure_logging(log_level)
    ctx.obj = CliContext(data_dir_option=data_dir, rpc_url_option=rpc_url)


def _one_line(message: str) -> str:
    """A message as the single line the invariant promises, whatever bytes a file or peer put in it."""
    return " ".join(message.split()) or "(no message)"


def main(argv: list[str] | None = None) -> int:
    err = make_console(stderr=True)
    try:
        # In non-standalone mode click returns a command's `typer.Exit(code)` instead of raising it.
        code = app(args=argv, standalone_mode=False)
    except RollnetError as exc:
        err.print(f"[bold red]error:[/] {escape(_one_line(str(exc)))}", highlight=False, soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except typer.Abort:
        err.print("aborted")
        return 1
    except typer.Exit as exc:
        return exc.exit_code
    except typer.TyperException as exc:  # click's ClickException family as typer vendors it; UsageError is 2
        show = getattr(exc, "show", None)
        if show is not None:
            show()
        else:
            err.print(f"error: {escape(_one_line(exc.format_message()))}", highlight=False, soft_wrap=True)
        return exc.exit_code
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
