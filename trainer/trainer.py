"""The GRPO trainer: fp32 master weights and optimiser state stay here; each step publishes a bf16 version.

Invariants: rewards are recomputed from the completion text and the task, never taken from a worker; π_old's
log-probs are recomputed without grad at the start of each optimisation step (one batch), then
`optimizer_steps` minibatch updates follow; a non-finite loss or gradient never reaches `optimizer.step()`:
the rest of the batch is skipped and counted, and a batch with no applied update publishes nothing. Crash
safety: the state (weights, optimiser, version) is written atomically *before* version v is published, and
publishing is idempotent, so a restart resumes at the last saved version and publishes it only if it is
missing: no version is published twice or skipped (with `persist_in_background`, the state is written and the
version put in the store on a background thread while the next step's forward passes run: the next
`optimizer.step()` waits for it, since it changes the tensors being written, and a step's `on_persisted`
callback runs, on that thread and in step order, only once both are done, so whoever publishes versions on
chain from it publishes only persisted ones, as soon as they are); it resumes only with the rollout settings
it saved (task, prompt format, length, temperature), so no run trains on two of them. Memory: a minibatch's gradient is
accumulated over micro-batches within the logit and token budgets (`node.rollout.microbatch`), each
backpropagated before the next is built, with the whole minibatch's loss normaliser, so it equals the gradient
of the minibatch taken whole and the recipe's lengths and batch sizes never set the peak.
"""

from __future__ import annotations

import copy
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from eth_account.signers.local import LocalAccount
from rollnet.node.delta.store import PolicyStore, Published
from rollnet.node.errors import ConfigError
from rollnet.node.model.policies import bf16_policy
from rollnet.node.tasks import Task
from rollnet.node.tasks.templated import ChatTemplatedTask
from rollnet.trainer.advantages import group_advantages
from rollnet.trainer.buffer import Group
from rollnet.trainer.config import GRPOConfig
from rollnet.trainer.logprobs import completion_logprobs, completion_microbatches
from rollnet.trainer.loss import LossStats, batch_normaliser, grpo_loss
from transformers import PreTrainedModel, PreTrainedTokenizerFast

STATE_FILE = "trainer-state.pt"
log = logging.getLogger(__name__)


@dataclass
class StepReport:
    version: int
    groups: int
    groups_without_signal: int
    samples: int
    mean_reward: float
    optimizer_steps: int = 0
    skipped_non_finite: bool = False
    loss: float = 0.0
    clipped_fraction: float = 0.0
    mean_ratio: float = 1.0
    max_ratio: float = 1.0
    grad_norm: float = 0.0
    staleness: list[int] = field(default_factory=list)
    published: Published | None = None
    seconds: float = 0.0
    ended_at: float = 0.0  # time.perf_counter() when the step's training ended


@dataclass
class MinibatchTally:
    """A minibatch's loss stats gathered from its micro-batches (each computed with the minibatch's normaliser,
    so their losses, KL and entropy add up): the clipped fraction and mean ratio weighted by each part's
    tokens, the max ratio over parts with tokens; exactly the stats of the minibatch computed whole."""

    loss: float = 0.0
    kl: float = 0.0
    entropy: float = 0.0
    tokens: int = 0
    clipped_tokens: float = 0.0
    ratio_sum: float = 0.0
    max_ratio: float | None = None

    def add(self, part: LossStats, tokens: int) -> None:
        self.loss += part.loss
        self.kl += part.kl
        self.entropy += part.entropy
        self.tokens += tokens
        self.clipped_tokens += part.clipped_fraction * max(1, tokens)
        if tokens:
            self.ratio_sum += part.mean_ratio * tokens
            self.max_ratio = part.max_ratio if self.max_ratio is None else max(self.max_ratio, part.max_ratio)

    def stats(self) -> LossStats:
        return LossStats(loss=self.loss, clipped_fraction=self.clipped_tokens / max(1, self.tokens),
                         mean_ratio=self.ratio_sum / self.tokens if self.tokens else 1.0,
                         max_ratio=1.0 if self.max_ratio is None else self.max_ratio, kl=self.kl,
                         entropy=self.entropy)


class Trainer:
    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, task: Task, config: GRPOConfig, *,
                 state_dir: Path | None = None, store: PolicyStore | None = None,
                 signer: LocalAccount | None = None, persist_in_background: bool = False):
        if store is not None and signer is None:
            raise ConfigError("publishing policy versions needs the trainer's signing key")
        self.model = model.float().train()
        self.tokenizer = tokenizer
        self.task = task
        self.config = config
        self.state_dir = state_dir
        self.store = store
        self.signer = signer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        self.reference = copy.deepcopy(model).eval() if config.kl_coef > 0 else None
        self.version = 0
        self.skipped_batches = 0
        self.groups_without_signal = 0
        self._published_tensors: dict[str, torch.Tensor] | None = None
        self._persist_pool = ThreadPoolExecutor(1, thread_name_prefix="trainer-persist") \
            if persist_in_background else None
        self._persisting: list[Future[None]] = []  # writes in flight (or failed)
        # Callbacks (chain transactions) run in order on a daemon thread: an interrupted trainer may leave one
        # hanging on a dead chain without keeping its process alive, and need not run those queued.
        self._callbacks: queue.Queue[tuple[Callable[[StepReport], None], StepReport] | None] = queue.Queue()
        self._dropping_callbacks = False
        self._callback_thread = threading.Thread(target=self._run_callbacks, name="trainer-persisted", daemon=True) \
            if persist_in_background else None
        if self._callback_thread is not None:
            self._callback_thread.start()
        if state_dir is not None and (state_dir / STATE_FILE).exists():
            self._load_state()
        else:
            self._save_state()
        self._publish_if_missing()

    # ------------------------------------------------------------------ state and publishing

    def _state(self) -> dict:
        """What a restart needs, as of now: the counters by value, the tensors by reference (left unchanged until
        written: see `_wait_for_persisting`)."""
        return {
            "version": self.version, "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "skipped_batches": self.skipped_batches, "groups_without_signal": self.groups_without_signal,
            "config": self.config.model_dump(), "rollout_settings": self.rollout_settings(),
            "reference": self.reference.state_dict() if self.reference is not None else None,
        }

    def _save_state(self, state: dict | None = None) -> None:
        if self.state_dir is None:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        state = state if state is not None else self._state()
        tmp = self.state_dir / (STATE_FILE + ".tmp")
        torch.save(state, tmp)
        tmp.replace(self.state_dir / STATE_FILE)

    def rollout_settings(self) -> dict[str, object]:
        """What shapes the rollouts this run trains on: the task, its prompt format, length and temperature.
        A run resumes only with the same settings, so no run mixes two of them."""
        return {"task": self.task.name, "chat_template": isinstance(self.task, ChatTemplatedTask),
                "max_new_tokens": self.config.max_new_tokens, "temperature": self.config.temperature}

    def _check_rollout_settings(self, state: dict) -> None:
        saved = state.get("rollout_settings")
        if not isinstance(saved, dict):  # a state saved before they were: its config still has length and temperature
            config = state.get("config") if isinstance(state.get("config"), dict) else {}
            saved = {name: config[name] for name in ("max_new_tokens", "temperature") if name in config}
        current = self.rollout_settings()
        changed = [f"{name} {saved[name]!r}, not {current[name]!r}" for name in current
                   if name in saved and saved[name] != current[name]]
        if changed:
            raise ConfigError(f"cannot resume {self.state_dir}: its run trained with {changed[0]}: repeat the run's "
                              "settings (--task, --max-new-tokens, --temperature, --chat-template/--raw-prompts) or "
                              "use another --run-dir")

    def _load_state(self) -> None:
        assert self.state_dir is not None
        try:
            state = torch.load(self.state_dir / STATE_FILE, weights_only=True)
            self._check_rollout_settings(state)
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, KeyError, OSError) as exc:
            raise ConfigError(f"cannot resume from {self.state_dir / STATE_FILE}: {exc}") from None
        if self.reference is not None and state.get("reference") is not None:
            self.reference.load_state_dict(state["reference"])
        self.version = int(state["version"])
        self.skipped_batches = int(state["skipped_batches"])
        self.groups_without_signal = int(state["groups_without_signal"])
        log.info("resumed trainer at version %d", self.version)

    def _publish_if_missing(self, tensors: dict[str, torch.Tensor] | None = None,
                            version: int | None = None) -> Published | None:
        """Put `version` (default: the current one) in the store unless it is there; `tensors` are its bf16
        weights (default: the model's now)."""
        if self.store is None:
            return None
        version = self.version if version is None else version
        latest = self.store.latest
        if latest is not None and latest > version:
            raise ConfigError(f"the policy store holds version {latest}, newer than the trainer state "
                              f"({version}): it belongs to another run")
        if latest == version:
            return None
        assert self.signer is not None
        tensors = tensors if tensors is not None else bf16_policy(self.model)
        published = self.store.publish(version, tensors, self.signer, previous=self._published_tensors)
        self._published_tensors = tensors
        return published

    # ------------------------------------------------------------------ training

    def rewards(self, group: Group) -> list[float]:
        instance = self.task.instance(group.task_seed)
        return [self.task.reward(instance, self.tokenizer.decode(r.tokens, skip_special_tokens=True))
                for r in group.rollouts]

    def train_on(self, groups: list[Group], on_persisted: Callable[[StepReport], None] | None = None) -> StepReport:
        """One optimisation step (a batch of whole groups): several minibatch updates, then a new version;
        `on_persisted(report)` once the version is written and in the store (with `persist_in_background`, later,
        on the writing thread, in step order; otherwise before this returns)."""
        started = time.perf_counter()
        samples, advantages, all_rewards, staleness = [], [], [], []
        without_signal = 0
        for group in groups:
            rewards = self.rewards(group)
            all_rewards += rewards
            group_adv = group_advantages(rewards, self.config.advantage_epsilon)
            if group_adv is None:
                without_signal += 1
                continue
            samples += group.rollouts
            advantages += group_adv
            staleness += [self.version - group.version] * len(group.rollouts)
        self.groups_without_signal += without_signal
        report = StepReport(self.version, len(groups), without_signal, len(samples),
                            sum(all_rewards) / max(1, len(all_rewards)), staleness=staleness)
        if samples:
            self._optimise(samples, torch.tensor(advantages), report)
        if report.optimizer_steps:
            self.version += 1
            report.version = self.version
            if self._persist_pool is None:
                self._save_state()
                report.published = self._publish_if_missing()
        report.ended_at = time.perf_counter()
        report.seconds = report.ended_at - started
        if self._persist_pool is None:
            if on_persisted is not None:
                on_persisted(report)
        else:  # the state now, and the bf16 copy: the next step's updates must not reach this version's delta
            state = self._state() if report.optimizer_steps else None
            tensors = bf16_policy(self.model) if report.optimizer_steps and self.store is not None else None
            self._persisting = [p for p in self._persisting if not p.done() or p.exception() is not None]
            self._persisting.append(self._persist_pool.submit(self._persist, report, state, tensors, on_persisted))
        return report

    def _persist(self, report: StepReport, state: dict | None, tensors: dict[str, torch.Tensor] | None,
                 on_persisted: Callable[[StepReport], None] | None) -> None:
        """Write a step (on the writing thread), then queue its callback on the callback thread: the next
        optimiser step waits for the write only, never for what the callback does (a chain transaction)."""
        if state is not None:  # a step that made no version only keeps its place in the order of callbacks
            self._save_state(state)
            report.published = self._publish_if_missing(tensors, version=state["version"])
        if on_persisted is not None:
            self._callbacks.put((on_persisted, report))

    def _run_callbacks(self) -> None:
        while (item := self._callbacks.get()) is not None:
            if not self._dropping_callbacks:
                self._call_back(*item)

    @staticmethod
    def _call_back(on_persisted: Callable[[StepReport], None], report: StepReport) -> None:
        try:
            on_persisted(report)
        except Exception:  # the caller's concern; the write itself succeeded
            log.exception("the callback after persisting version %d failed", report.version)

    def _wait_for_persisting(self) -> None:
        for pending in self._persisting:
            pending.result()

    def close(self, run_callbacks: bool = True) -> None:
        """Finish writing (background persistence): every pending step is written and, with `run_callbacks`, its
        callback run (an interrupted trainer keeps its state but publishes nothing more). A failed write raises
        here once; closing again is a no-op."""
        if self._persist_pool is None:
            return
        pool, self._persist_pool = self._persist_pool, None
        pool.shutdown(wait=True)  # every write done, so every callback queued
        if self._callback_thread is not None:
            self._dropping_callbacks = not run_callbacks
            self._callbacks.put(None)
            if run_callbacks:
                self._callback_thread.join()
        pending, self._persisting = self._persisting, []
        for done in pending:
            done.result()

    def _logprobs(self, model: PreTrainedModel, samples: list, with_entropy: bool = False) -> tuple:
        return completion_logprobs(model, [s.prompt_tokens for s in samples], [s.tokens for s in samples],
                                   pad_id=self.pad_id, temperature=self.config.temperature,
                                   with_entropy=with_entropy)

    def _optimise(self, samples: list, advantages: torch.Tensor, report: StepReport) -> None:
        config = self.config
        with torch.no_grad():
            old_logprobs, _, _ = self._logprobs(self.model, samples)
            ref_logprobs = self._logprobs(self.reference, samples)[0] if self.reference is not None else None
        if not torch.isfinite(old_logprobs).all():
            self._skip(report, "non-finite log-probs under the current policy")
            return
        per_step = math.ceil(len(samples) / config.optimizer_steps)
        losses, clipped, ratios, max_ratio, norms = [], [], [], 1.0, []
        for start in range(0, len(samples), per_step):
            rows = list(range(start, min(start + per_step, len(samples))))
            stats = self._accumulate_gradient(samples, rows, old_logprobs, ref_logprobs, advantages)
            if isinstance(stats, str):
                self.optimizer.zero_grad(set_to_none=True)
                self._skip(report, stats)
                return
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.max_grad_norm)
            if not torch.isfinite(norm):
                self.optimizer.zero_grad(set_to_none=True)
                self._skip(report, f"non-finite gradient norm ({float(norm)})")
                return
            self._wait_for_persisting()  # the last version's tensors are still being written
            self.optimizer.step()
            report.optimizer_steps += 1
            losses.append(stats.loss)
            clipped.append(stats.clipped_fraction)
            ratios.append(stats.mean_ratio)
            max_ratio = max(max_ratio, stats.max_ratio)
            norms.append(float(norm))
        report.loss = sum(losses) / len(losses)
        report.clipped_fraction = sum(clipped) / len(clipped)
        report.mean_ratio = sum(ratios) / len(ratios)
        report.max_ratio = max_ratio
        report.grad_norm = sum(norms) / len(norms)

    def _accumulate_gradient(self, samples: list, rows: list[int], old_logprobs: torch.Tensor,
                             ref_logprobs: torch.Tensor | None, advantages: torch.Tensor) -> LossStats | str:
        """Leave the gradient of the minibatch `rows` in the parameters, accumulated over the micro-batches
        `completion_microbatches` gives (each one's graph freed by its backward before the next is built),
        with the whole minibatch's normaliser so the sum is the whole minibatch's gradient; return the
        minibatch's stats, or why it must be skipped (a non-finite loss or ratio, before that backward)."""
        config = self.config
        minibatch = [samples[i] for i in rows]
        normaliser = batch_normaliser([len(s.tokens) for s in minibatch], config.loss_normalisation)
        parts = completion_microbatches([s.prompt_tokens for s in minibatch], [s.tokens for s in minibatch],
                                        self.model.config.vocab_size)
        tally = MinibatchTally()
        self.optimizer.zero_grad(set_to_none=True)
        for part in parts:
            chosen = [rows[i] for i in part]
            logprobs, mask, entropy = self._logprobs(self.model, [samples[i] for i in chosen],
                                                     with_entropy=config.entropy_coef > 0)
            width = logprobs.shape[1]
            loss, stats = grpo_loss(
                logprobs, old_logprobs[chosen, :width], advantages[chosen], mask, epsilon=config.epsilon,
                delta=config.delta, normalisation=config.loss_normalisation,
                ref_logprobs=ref_logprobs[chosen, :width] if ref_logprobs is not None else None,
                kl_coef=config.kl_coef, entropy=entropy, entropy_coef=config.entropy_coef, normaliser=normaliser,
            )
            if not math.isfinite(stats.loss) or not math.isfinite(stats.max_ratio):
                return f"non-finite loss or ratio (loss {stats.loss}, max ratio {stats.max_ratio})"
            loss.backward()
            tally.add(stats, int(mask.sum()))
        return tally.stats()

    def _skip(self, report: StepReport, why: str) -> None:
        self.skipped_batches += 1
        report.skipped_non_finite = True
        log.warning("skipping the rest of the batch at version %d: %s", self.version, why)
