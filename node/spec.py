"""A requester's job spec: the TOML file `rollnet job deploy --spec` reads, validated, and its ABI tuple.

Invariants: a spec that passes `load_job_spec` is well-formed (types, ranges, at most 3 decimals for the
clip values, amounts in whole wei and at most MAX_ETH); whatever bytes the file holds, a refusal is one
`ConfigError` line naming the file and at most a few fields, never a traceback. `check_workable` refuses a
spec no worker could run (a task the task registry does not know; a model whose root neither model_root
nor rollnet pins, so workers could not check their weights against it); `rollnet job deploy` runs it before any
transaction. The chain-dependent rules (slash caps at the registry's minimum stakes, the timeline rule
against the unbonding period) live only in `JobFactory.validateSpec`, which `rollnet job deploy` asks
before sending anything, so a bad field is reported by its name in this file and costs no gas. Amounts
are ETH strings, durations seconds. There is no arbiter: outcomes come from validator committees.
"""

from __future__ import annotations

import tomllib
from decimal import Decimal
from pathlib import Path
from typing import Annotated

from eth_utils import is_address, to_checksum_address
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from rollnet.node.errors import ConfigError
from rollnet.node.model.pinned import EMBEDDED_FILES_HASH, EMBEDDED_MODEL, EMBEDDED_ROOT, EMBEDDED_TASK, PRESETS
from rollnet.node.sampling import PPM, samples_checked
from rollnet.node.units import WEI_PER_ETH, eth_to_wei

DAY = 86_400
MAX_ETH = Decimal(10) ** 9  # more ETH than will ever exist (about 1.2e8 today): anything above is a typo
MAX_SPEC_BYTES = 64 * 1024  # examples/job.toml is 3 KiB
MAX_NAME_CHARS = 256
MAX_PROBLEMS_SHOWN = 4


def _whole_wei(value: Decimal) -> Decimal:
    if (value * WEI_PER_ETH) % 1:
        raise ValueError("has more than 18 decimal places (1 wei is 1e-18 ETH)")
    return value


Seconds = Annotated[int, Field(ge=1, le=30 * DAY)]
EthAmount = Annotated[Decimal, Field(gt=0, le=MAX_ETH), AfterValidator(_whole_wei)]

# Fields of the arbiter design, refused with what replaced them.
RETIRED_FIELDS = {
    "arbiter": "there is no arbiter: outcomes come from staked validator committees and their appeals",
    "quorum": "use committee_size: a round is decided when one side holds more than half the validator stake",
    "challenge_seconds": "use appeal_seconds",
    "resolve_seconds": "appeal rounds are voted by committees: vote_seconds applies to every round",
    "challenge_bond_eth": "use appeal_bond_eth",
}
# The contract's JobSpec field names, as JobFactory.validateSpec names them, to this file's names.
CONTRACT_FIELDS = {
    "trainer": "trainer", "groupSize": "group_size", "tasksPerLease": "tasks_per_lease",
    "committeeSize": "committee_size", "appealRounds": "appeal_rounds", "clipEpsilonMilli": "clip_epsilon",
    "clipDeltaMilli": "clip_delta", "leaseDuration": "lease_seconds", "voteWindow": "vote_seconds",
    "appealWindow": "appeal_seconds", "rewardPerSample": "reward_per_sample_eth", "slashAmount": "slash_eth",
    "expiryFee": "expiry_fee_eth", "voterSlash": "voter_slash_eth", "absentPenalty": "absent_penalty_eth",
    "appealBond": "appeal_bond_eth", "modelHash": "model_root", "taskConfigHash": "task",
    "modelFilesHash": "model_files_hash",
    "modelName": "model", "taskName": "task", "maxNewTokens": "max_new_tokens", "temperatureMilli": "temperature",
    "samplesChecked": "sampled_fraction", "minCheatPpm": "detectable_cheat_fraction",
}
MAX_NEW_TOKENS = 4096  # JobFactory.MAX_NEW_TOKENS
MAX_TEMPERATURE = Decimal(5)  # JobFactory.MAX_TEMPERATURE_MILLI / 1000
MIN_TEMPERATURE = Decimal("0.1")  # JobFactory.MIN_TEMPERATURE_MILLI / 1000


class JobSpecFile(BaseModel):
    """The `[job]` table of a spec file; see examples/job.toml for every field documented."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=MAX_NAME_CHARS,
                       description="model name, or 'embedded' for the built-in default")
    model_root: str | None = Field(default=None, description="0x-prefixed 32-byte content root of version 0")
    model_files_hash: str | None = Field(default=None, description="0x-prefixed 32-byte identity of the model's "
                                         "config, tokenizer, chat template and EOS set (node/model/identity.py)")
    task: str = Field(min_length=1, max_length=MAX_NAME_CHARS, description="task generator or task file name")
    trainer: str = Field(description="address that publishes policy versions; 'self' for the requester")
    group_size: int = Field(ge=2, le=1024)
    tasks_per_lease: int = Field(ge=1, le=1024)
    max_staleness: int = Field(ge=0, le=1024)
    committee_size: int = Field(ge=1, le=64)
    appeal_rounds: int = Field(ge=1, le=3)
    clip_epsilon: Decimal = Field(gt=0, lt=1)
    clip_delta: Decimal = Field(gt=1, le=1000)
    max_new_tokens: int = Field(6, ge=1, le=MAX_NEW_TOKENS, description="most tokens a completion may have")
    temperature: Decimal = Field(Decimal(1), ge=MIN_TEMPERATURE, le=MAX_TEMPERATURE, description="sampling temperature")
    chat_template: bool = Field(False, description="wrap prompts in the tokenizer's chat template")
    stop_on_eos: bool = Field(True, description="a completion ends at its first EOS (else always full length)")
    lease_seconds: Seconds
    vote_seconds: Seconds
    appeal_seconds: Seconds
    reward_per_sample_eth: EthAmount
    slash_eth: EthAmount
    expiry_fee_eth: EthAmount
    voter_slash_eth: EthAmount
    absent_penalty_eth: EthAmount
    appeal_bond_eth: EthAmount
    # 1/32: verification costs at most a tenth of generation at committee size 3 (BENCHMARKS.md, issue 17)
    sampled_fraction: Decimal = Field(Decimal("0.03125"), gt=0, le=1, description="part of a batch each "
                                      "first-round committee member verifies (appeal rounds verify all)")
    detectable_cheat_fraction: Decimal = Field(Decimal("0.01"), ge=Decimal("0.000001"), le=1,
                                               description="smallest faked part of a batch the sizing rule covers")

    @model_validator(mode="before")
    @classmethod
    def _no_retired_fields(cls, data: object) -> object:
        if isinstance(data, dict):
            for name, replacement in RETIRED_FIELDS.items():
                if name in data:
                    raise ValueError(f"field '{name}' is gone: {replacement}")
        return data

    @field_validator("model", "task")
    @classmethod
    def _printable_name(cls, value: str) -> str:
        if not (value.isascii() and value.isprintable()):
            raise ValueError("must be printable ASCII (the chain stores names as text every participant prints)")
        return value

    @field_validator("model_root", "model_files_hash")
    @classmethod
    def _root_is_32_bytes(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            if not value.startswith("0x") or len(value) != 66:
                raise ValueError
            bytes.fromhex(value[2:])
        except ValueError:
            raise ValueError("must be 0x followed by 64 hex digits") from None
        return value

    @field_validator("trainer")
    @classmethod
    def _is_address(cls, value: str) -> str:
        if value == "self":
            return value
        if not is_address(value):
            raise ValueError("must be an Ethereum address or 'self'")
        return to_checksum_address(value)

    @model_validator(mode="after")
    def _thousandths(self) -> JobSpecFile:
        for name in ("clip_epsilon", "clip_delta", "temperature"):
            if (getattr(self, name) * 1000) % 1 != 0:
                raise ValueError(f"{name} has more than 3 decimal places")
        if (self.detectable_cheat_fraction * PPM) % 1 != 0:
            raise ValueError("detectable_cheat_fraction has more than 6 decimal places (the chain counts in ppm)")
        return self

    @property
    def rollouts_per_lease(self) -> int:
        return self.group_size * self.tasks_per_lease

    @property
    def samples_checked(self) -> int:
        """Rollouts each first-round committee member verifies: ceil(sampled_fraction x rollouts per lease)."""
        return samples_checked(self.sampled_fraction, self.rollouts_per_lease)

    @property
    def pinned_by_rollnet(self) -> bool:
        """Whether rollnet pins this model's root itself: the embedded model built for its default task, or a
        preset rollnet converts (`model.pinned.PRESETS`, for any task)."""
        return (self.model == EMBEDDED_MODEL and self.task == EMBEDDED_TASK) or self.model in PRESETS

    def _pinned(self) -> tuple[str, str]:
        """The pinned (root, files hash) of a model rollnet pins (see `pinned_by_rollnet`)."""
        preset = PRESETS.get(self.model)
        return (preset.root, preset.files_hash) if preset else (EMBEDDED_ROOT, EMBEDDED_FILES_HASH)

    def root_of_version_zero(self) -> bytes:
        """The base model's content root: model_root, else the embedded model's pinned root."""
        if self.model_root:
            return bytes.fromhex(self.model_root[2:])
        if self.pinned_by_rollnet:
            return bytes.fromhex(self._pinned()[0])
        raise ConfigError(f"model {_printable(self.model)!r} for task {_printable(self.task)!r} has no pinned "
                          "content root: set model_root (or deploy with --model PATH)")

    def files_hash_of_version_zero(self) -> bytes:
        """The base model's config-and-tokenizer identity: model_files_hash, else the embedded model's pinned
        one (a model_root without it is refused: the weights alone do not say how text maps to tokens)."""
        if self.model_files_hash:
            return bytes.fromhex(self.model_files_hash[2:])
        if self.pinned_by_rollnet and not self.model_root:
            return bytes.fromhex(self._pinned()[1])
        raise ConfigError(f"model {_printable(self.model)!r} has no pinned config and tokenizer: set "
                          "model_files_hash (or deploy with --model PATH)")

    def to_abi(self, requester: str) -> tuple:
        """The `JobSpec` struct as a tuple in Solidity field order; the task's configuration hash comes from
        the task registry (an unknown task is a ConfigError)."""
        from rollnet.node.tasks import load_task, task_config_hash

        trainer = requester if self.trainer == "self" else self.trainer
        return (
            self.root_of_version_zero(),
            task_config_hash(load_task(self.task)),
            trainer,
            self.group_size,
            self.tasks_per_lease,
            self.max_staleness,
            self.committee_size,
            self.appeal_rounds,
            int(self.clip_epsilon * 1000),
            int(self.clip_delta * 1000),
            self.lease_seconds,
            self.vote_seconds,
            self.appeal_seconds,
            eth_to_wei(self.reward_per_sample_eth, "reward_per_sample_eth"),
            eth_to_wei(self.slash_eth, "slash_eth"),
            eth_to_wei(self.expiry_fee_eth, "expiry_fee_eth"),
            eth_to_wei(self.voter_slash_eth, "voter_slash_eth"),
            eth_to_wei(self.absent_penalty_eth, "absent_penalty_eth"),
            eth_to_wei(self.appeal_bond_eth, "appeal_bond_eth"),
            self.model,
            self.task,
            self.max_new_tokens,
            int(self.temperature * 1000),
            self.chat_template,
            self.stop_on_eos,
            self.files_hash_of_version_zero(),
            self.samples_checked,
            int(self.detectable_cheat_fraction * PPM),
        )

    def lease_cost_wei(self) -> int:
        return eth_to_wei(self.reward_per_sample_eth) * self.group_size * self.tasks_per_lease


def _printable(text: str, limit: int = 60) -> str:
    """A stranger's key or value as a short single line: control characters escaped, long text cut."""
    shown = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def _describe(error: dict) -> str:
    field = _printable(".".join(str(part) for part in error["loc"])) or "spec"
    message = _printable(str(error["msg"]).removeprefix("Value error, "), limit=300)
    if error["type"] == "missing":
        return f"missing field '{field}'"
    if error["type"] == "extra_forbidden":
        return f"unknown field '{field}'"
    if field == "spec":
        return message
    return f"field '{field}': {message}"


def parse_job_spec(data: dict, source: str = "spec") -> JobSpecFile:
    table = data.get("job", data)
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [job] must be a table")
    try:
        return JobSpecFile.model_validate(table)
    except ValidationError as exc:
        problems = [_describe(err) for err in exc.errors()]
        more = len(problems) - MAX_PROBLEMS_SHOWN
        shown = "; ".join(problems[:MAX_PROBLEMS_SHOWN]) + (f"; and {more} more" if more > 0 else "")
        raise ConfigError(f"{source}: {shown}") from None


def _read_spec_text(path: Path) -> str:
    """The file's text, refusing what is not a small UTF-8 file."""
    if not path.exists():
        raise ConfigError(f"spec file {path} does not exist")
    if not path.is_file():
        raise ConfigError(f"spec file {path} is not a file")
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read spec file {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise ConfigError(f"spec file {path} is larger than {MAX_SPEC_BYTES // 1024} KiB: not a job spec")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: not UTF-8 text (byte {exc.start})") from None


def load_job_spec(path: Path) -> JobSpecFile:
    text = _read_spec_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {_printable(str(exc), limit=200)}") from None
    except RecursionError:
        raise ConfigError(f"{path} is not a job spec: its values are nested too deeply") from None
    return parse_job_spec(data, str(path))


def check_workable(spec: JobSpecFile, source: str = "spec") -> None:
    """Refuse, before anything is sent, a spec whose recipe no worker could run: a task the task registry
    does not know, or a model rollnet does not build whose weights no model_root pins, or whose config and
    tokenizer no model_files_hash pins."""
    from rollnet.node.tasks import load_task

    try:
        load_task(spec.task)
    except ConfigError as exc:
        raise ConfigError(f"{source}: field 'task': {exc}") from None
    if spec.model_root is None and not spec.pinned_by_rollnet:
        raise ConfigError(
            f"{source}: field 'model': rollnet pins the root only of the {EMBEDDED_MODEL!r} model for "
            f"{EMBEDDED_TASK!r} and of the presets {', '.join(sorted(PRESETS))} (any task); "
            f"for {_printable(spec.model)!r} with task {_printable(spec.task)!r} set model_root "
            "to its bf16 content root, or deploy with --model PATH, so workers can check their weights against it")
    if spec.model_files_hash is None and not (spec.pinned_by_rollnet and spec.model_root is None):
        raise ConfigError(
            f"{source}: field 'model_files_hash' is required with a model_root (`rollnet model identity PATH` "
            "prints both, or deploy with --model PATH), so every participant runs the same config and tokenizer")


def explain_spec_refusal(error_name: str | None, args: dict, source: str) -> ConfigError | None:
    """The factory's refusal of a spec (`InvalidSpec`, `TimelineTooLong`) as a one-line error naming this
    file's field; None for any other error."""
    if error_name == "InvalidSpec":
        field = CONTRACT_FIELDS.get(str(args.get("field")), str(args.get("field")))
        return ConfigError(f"{source}: field '{field}' is out of the factory's bounds (amounts > 0; slash_eth at "
                           "most the worker minimum stake, voter_slash_eth the validator minimum; expiry_fee_eth "
                           "<= slash_eth; absent_penalty_eth <= voter_slash_eth / 10; vote_seconds and "
                           "appeal_seconds at least 60)")
    if error_name == "CheatNotDeterred":
        ppm = int(args.get("cheatPpm", 0))
        remedy = ("raise slash_eth above a lease's pay, or lower that pay (reward_per_sample_eth x group_size x "
                  "tasks_per_lease)" if ppm >= PPM else
                  "verify more (sampled_fraction, committee_size), raise slash_eth, or raise "
                  "detectable_cheat_fraction")
        return ConfigError(
            f"{source}: a cheat on {100 * ppm / PPM:g}% of a batch would pay: its expected slash "
            f"({Decimal(int(args.get('expectedSlash', 0))) / WEI_PER_ETH:f} ETH: slash_eth times the chance that "
            f"a first committee of committee_size members, each verifying sampled_fraction of the batch, catches "
            f"it) does not exceed its gain (that part's pay, {Decimal(int(args.get('gain', 0))) / WEI_PER_ETH:f} "
            f"ETH): {remedy}")
    if error_name == "TimelineTooLong":
        return ConfigError(
            f"{source}: lease_seconds + (appeal_rounds + 1) x vote_seconds + appeal_rounds x appeal_seconds + one "
            f"day of keeper margin = {args.get('timeline')} s must be shorter than the registry's unbonding period "
            f"({args.get('unbondingPeriod')} s), so stake stays slashable until every round can have ended")
    return None
