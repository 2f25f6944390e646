"""Split rows into micro-batches whose logits fit one token × vocabulary budget.

A batched forward pass with `logits_to_keep` computes logits for one run of positions shared by all its rows:
from the smallest first position any row needs to the largest end, so a micro-batch of n rows whose needed
logit positions are the half-open spans [first_i, end_i) materialises n × (max end_i - min first_i) × vocab
logits. Invariant: `split_rows` returns consecutive micro-batches that together hold every row exactly once,
in the order given, and each micro-batch's logits stay within the budget, except a single row that alone
exceeds it, which then forms a micro-batch by itself (rows are never split along positions).

LOGIT_BUDGET = 64 Mi float elements, i.e. 256 MiB of fp32 logits per forward pass. The working copies made
from the logits (a float copy at the produced positions, its log-softmax, their gradients in training) are each
no larger, so a micro-batch's peak is a small multiple of that, about a GiB: safe on a CPU node or beside a
model on a GPU, yet large enough that the LM head still runs on hundreds of positions at once. With the
embedded model's vocabulary of a few dozen tokens every realistic batch is one micro-batch (nothing changes
there); with a 49,152-token vocabulary a pass holds about 1,365 logit positions: about 195 rows of 6-token
completions, while a 4,096-token completion goes alone (4,097 positions, 768 MiB of fp32 logits: the
unavoidable single-row cost).
"""

from __future__ import annotations

from collections.abc import Sequence

LOGIT_BUDGET = 64 * 2**20  # float elements of logits one forward pass may materialise (256 MiB in fp32)


def logit_elements(spans: Sequence[tuple[int, int]], vocab_size: int) -> int:
    """How many logits one forward pass over rows needing these [first, end) position spans materialises."""
    if not spans:
        return 0
    width = max(end for _, end in spans) - min(first for first, _ in spans)
    return len(spans) * width * vocab_size


def split_rows(rows: Sequence[int], spans: Sequence[tuple[int, int]], vocab_size: int,
               budget: int | None = None) -> list[list[int]]:
    """`rows` in consecutive micro-batches within `budget` logits (default: LOGIT_BUDGET, read at call time);
    `spans[k]` is the [first, end) run of logit positions row `rows[k]` needs (see the module invariant)."""
    if len(rows) != len(spans):
        raise ValueError(f"{len(rows)} rows but {len(spans)} position spans")
    limit = LOGIT_BUDGET if budget is None else budget
    batches: list[list[int]] = []
    batch: list[int] = []
    batch_spans: list[tuple[int, int]] = []
    for row, span in zip(rows, spans, strict=True):
        if batch and logit_elements([*batch_spans, span], vocab_size) > limit:
            batches.append(batch)
            batch, batch_spans = [], []
        batch.append(row)
        batch_spans.append(span)
    if batch:
        batches.append(batch)
    return batches
