"""Split rows into micro-batches whose logits fit one token × vocabulary budget and whose tokens fit one
token budget.

A batched forward pass with `logits_to_keep` computes logits for one run of positions shared by all its rows:
from the smallest first position any row needs to the largest end, so a micro-batch of n rows whose needed
logit positions are the half-open spans [first_i, end_i) materialises n × (max end_i - min first_i) × vocab
logits, and runs the whole model over n × max end_i tokens (rows are padded to the longest; each span ends at
its row's sequence length). Invariant: `split_rows` returns consecutive micro-batches that together hold
every row exactly once, in the order given, and each micro-batch's logits stay within LOGIT_BUDGET and its
tokens within TOKEN_BUDGET, except a single row that alone exceeds one of them, which then forms a
micro-batch by itself (rows are never split along positions).

TOKEN_BUDGET = 8,192 tokens per forward pass bounds everything else a pass holds, which grows with tokens,
not with kept logits: the hidden states a validator captures (tokens × hidden), each layer's MLP activations
(tokens × intermediate: 50 MB for SmolLM2-135M, 0.6 GB for a 7B model, without autograd), and, under
autograd, the activations every layer saves for backward. Without it, a worker submitting one-token
completions of long prompts would pack hundreds of full-length rows into one validator pass.

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
TOKEN_BUDGET = 8192  # tokens (rows × padded length) one forward pass may run the model over


def logit_elements(spans: Sequence[tuple[int, int]], vocab_size: int) -> int:
    """How many logits one forward pass over rows needing these [first, end) position spans materialises."""
    if not spans:
        return 0
    width = max(end for _, end in spans) - min(first for first, _ in spans)
    return len(spans) * width * vocab_size


def batch_tokens(spans: Sequence[tuple[int, int]]) -> int:
    """How many tokens one forward pass over rows with these spans runs (rows padded to the longest end)."""
    return len(spans) * max((end for _, end in spans), default=0)


def split_rows(rows: Sequence[int], spans: Sequence[tuple[int, int]], vocab_size: int,
               budget: int | None = None, token_budget: int | None = None) -> list[list[int]]:
    """`rows` in consecutive micro-batches within `budget` logits and `token_budget` tokens (defaults:
    LOGIT_BUDGET and TOKEN_BUDGET, read at call time); `spans[k]` is the [first, end) run of logit positions
    row `rows[k]` needs, ending at its sequence length (see the module invariant)."""
    if len(rows) != len(spans):
        raise ValueError(f"{len(rows)} rows but {len(spans)} position spans")
    limit = LOGIT_BUDGET if budget is None else budget
    token_limit = TOKEN_BUDGET if token_budget is None else token_budget
    batches: list[list[int]] = []
    batch: list[int] = []
    batch_spans: list[tuple[int, int]] = []
    for row, span in zip(rows, spans, strict=True):
        grown = [*batch_spans, span]
        if batch and (logit_elements(grown, vocab_size) > limit or batch_tokens(grown) > token_limit):
            batches.append(batch)
            batch, batch_spans = [], []
        batch.append(row)
        batch_spans.append(span)
    if batch:
        batches.append(batch)
    return batches
