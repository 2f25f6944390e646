"""Where a node keeps its state, and which chain it talks to.

Invariant: the deployment file is `ROLLNET_DEPLOYMENT`, else `<data-dir>/deployment.json`; the data
directory is `--data-dir`, else `ROLLNET_HOME`, else `~/.rollnet`; the RPC URL is
`--rpc-url`, else `ROLLNET_RPC_URL`, else the URL saved by `rollnet chain up` in the deployment file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, ValidationError
from rollnet.node.errors import ConfigError

DEPLOYMENT_FILE = "deployment.json"


def resolve_data_dir(explicit: Path | None = None) -> Path:
    """The node's data directory (created on demand with mode 0700)."""
    if explicit is not None:
        path = explicit
    elif os.environ.get("ROLLNET_HOME"):
        path = Path(os.environ["ROLLNET_HOME"])
    else:
        path = Path.home() / ".rollnet"
    path = path.expanduser()
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def deployment_path(data_dir: Path) -> Path:
    """`ROLLNET_DEPLOYMENT` (a deployment shared by several nodes), else `<data-dir>/deployment.json`."""
    shared = os.environ.get("ROLLNET_DEPLOYMENT")
    return Path(shared) if shared else data_dir / DEPLOYMENT_FILE


class Deployment(BaseModel):
    """The addresses `rollnet chain up` deployed, and the chain they live on."""

    chain_id: int
    rpc_url: str
    registry: str
    factory: str
    job_implementation: str
    deployed_at_block: int
    anvil_pid: int | None = None

    def save(self, data_dir: Path) -> Path:
        path = deployment_path(data_dir)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.model_dump_json(indent=2))
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, data_dir: Path) -> Deployment:
        path = deployment_path(data_dir)
        if not path.exists():
            raise ConfigError(f"no deployment in {data_dir}: run `rollnet chain up` first")
        try:
            return cls.model_validate(json.loads(path.read_text()))
        except (json.JSONDecodeError, ValidationError) as exc:
            raise ConfigError(f"{path} is corrupt ({type(exc).__name__}); run `rollnet chain up` again") from exc

    @classmethod
    def load_optional(cls, data_dir: Path) -> Deployment | None:
        return cls.load(data_dir) if deployment_path(data_dir).exists() else None


def resolve_rpc_url(explicit: str | None, data_dir: Path) -> str:
    """The chain endpoint to use, by the precedence in the module docstring."""
    if explicit:
        return explicit
    if os.environ.get("ROLLNET_RPC_URL"):
        return os.environ["ROLLNET_RPC_URL"]
    deployment = Deployment.load_optional(data_dir)
    if deployment is None:
        raise ConfigError("no chain configured: pass --rpc-url, set ROLLNET_RPC_URL, or run `rollnet chain up`")
    return deployment.rpc_url
