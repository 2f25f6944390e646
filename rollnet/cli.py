"""The `rollnet` command: composes each role package's sub-commands and prints user errors as one line.

Invariant: a usage error (an unknown command or option, a missing or malformed value; see
`rollnet.node.cli.params`) exits 2 with click's usage line and one `Error:` line; a RollnetError (user
mistake or environment problem found while running) exits 1 with one `error: <message>` line on stderr;
neither prints a traceback. Anything else is a bug and keeps its traceback. typer 0.29 vendors click and
raises its own exception classes (all `typer.TyperException`, each with its exit code and `show()`),
not click's; pyproject.toml pins the typer these handlers are written for.

A command imports only its own sub-command's module (`SUBCOMMANDS`): `rollnet keys new` or `rollnet chain up`
never loads torch, transformers or the trainer; `rollnet --help` lists every sub-command and so loads them all.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator, MutableMapping
from pathlib import Path

import typer
from rich.markup import escape
from typer.core import TyperGroup

from rollnet.node.cli import params
from rollnet.node.cli.context import CliContext, configure_logging, make_console
from rollnet.node.errors import RollnetError

# name -> (module, attribute): a command function or a Typer app (a group of commands), in help order.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "devnet": ("rollnet.devnet", "devnet"),
    "budget": ("rollnet.node.cli.budget_cmd", "budget"),
    "keys": ("rollnet.node.cli.keys_cmd", "app"),
    "chain": ("rollnet.node.cli.chain_cmd", "app"),
    "node": ("rollnet.node.cli.node_cmd", "app"),
    "job": ("rollnet.node.cli.job_cmd", "app"),
    "model": ("rollnet.node.cli.model_cmd", "app"),
    "rollout": ("rollnet.node.cli.rollout_cmd", "app"),
    "trainer": ("rollnet.trainer.cli", "app"),
    "validator": ("rollnet.validator.cli", "app"),
}


def load_subcommand(name: str) -> typer.core.TyperCommand | TyperGroup:
    """The click command `rollnet NAME` runs, built exactly as typer builds a registered sub-app or command."""
    module, attribute = SUBCOMMANDS[name]
    target = getattr(importlib.import_module(module), attribute)
    holder = typer.Typer(add_completion=False)
    if isinstance(target, typer.Typer):
        holder.add_typer(target, name=name)
    else:
        holder.command(name)(target)
    return typer.main.get_group(holder).commands[name]


class LazyCommands(MutableMapping):
    """The root's sub-commands by name: every name is known up front, each module is imported on first use."""

    def __init__(self) -> None:
        self._names = list(SUBCOMMANDS)
        self._loaded: dict[str, object] = {}

    def __getitem__(self, name: str):  # noqa: ANN204
        if name not in self._names:
            raise KeyError(name)
        if name not in self._loaded:
            try:
                self._loaded[name] = load_subcommand(name)
            except KeyError as exc:  # a bug in the module, which click's `.get()` would report as "no such command"
                raise RuntimeError(f"loading `rollnet {name}` failed: KeyError {exc}") from exc
        return self._loaded[name]

    def __contains__(self, name: object) -> bool:
        return name in self._names  # known without importing the module

    def __setitem__(self, name: str, command) -> None:  # noqa: ANN001
        if name not in self._names:
            self._names.append(name)
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        self._names.remove(name)
        self._loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._names))

    def __len__(self) -> int:
        return len(self._names)


class LazyRoot(TyperGroup):
    """The `rollnet` group: `rollnet keys new` imports the keys commands only, never torch or the trainer."""

    def __init__(self, **attrs) -> None:  # noqa: ANN003
        super().__init__(**attrs)
        self.commands = LazyCommands()


app = typer.Typer(
    name="rollnet",
    cls=LazyRoot,
    help="rollnet: a permissionless compute market for RL post-training.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def load_every_command() -> None:
    """Import every sub-command's module now (a process that forks many CLI runs does this once, first)."""
    for name in SUBCOMMANDS:
        load_subcommand(name)


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
