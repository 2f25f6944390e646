"""What one policy version costs a follower (a worker or validator) on the embedded model, side by side:
the dropped model reused for the next version (nothing else holds it) against a copy of the base model for
every version (a caller holds the last four models it was given, so the one the cache drops is still held and
cannot be reused; as many models stay alive as in the other arm, give or take one).

Versions: real updates of the embedded model (its reference build; AdamW at lr 1e-5 on the cross-entropy of
addition prompts with their answers), published by a trainer's PolicyStore as signed deltas and added to a
follower's store, as `PolicyFollower` does. Per version the follower applies the delta to the head's weights
(signature, section hashes, every tensor against the signed root), checks the root against the published
one, and loads the weights into a model (`StorePolicies`). CPU seconds, one thread.

Usage: python bench/follower.py [--quick] [--json PATH]
Invariant: both arms apply the same deltas to the same store, and each returned model is checked bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import deque
from pathlib import Path

import torch


def versions_of(base: torch.nn.Module, tokenizer: object, count: int) -> list[dict[str, torch.Tensor]]:
    """bf16 snapshots after each of `count` AdamW steps (lr 1e-5) of cross-entropy on fixed addition prompts."""
    import copy

    from rollnet.node.model.policies import bf16_policy
    from rollnet.node.tasks import load_task

    model = copy.deepcopy(base).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    task = load_task("addition-2digit")
    snapshots = [bf16_policy(model)]
    for step in range(count):
        rows = [tokenizer.encode(i.prompt + i.answer) for i in task.examples(range(step * 64, step * 64 + 64))]
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        snapshots.append(bf16_policy(model))
    return snapshots


def run_arm(folder: Path, trainer_address: str, base: torch.nn.Module, tokenizer: object,
            versions: list[dict[str, torch.Tensor]], roots: dict[int, bytes], hold: bool) -> dict:
    from rollnet.node.delta.store import PolicyStore
    from rollnet.node.model.policies import StorePolicies

    policies = StorePolicies(PolicyStore(folder, trainer=trainer_address), base, tokenizer, roots.__getitem__)
    held: deque = deque(maxlen=policies.cache + 1)  # the cache's models and the one it drops next
    first, _ = policies(1)
    if hold:
        held.append(first)
    del first
    started = time.process_time()
    for version in range(2, len(versions)):
        model, _ = policies(version)
        if hold:
            held.append(model)
        del model
    seconds = time.process_time() - started
    reused = policies.reused
    for version in range(len(versions) - 3, len(versions)):  # the cache's models are exactly their versions
        model, _ = policies(version)
        assert all(torch.equal(model.state_dict()[n].to(torch.bfloat16), t) for n, t in versions[version].items())
    return {"ms_per_version": 1000 * seconds / (len(versions) - 2), "versions": len(versions) - 2, "reused": reused}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, default=Path("bench/results/follower.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    from rich.table import Table
    from rollnet.node.cli.context import make_console
    from rollnet.node.delta.checkpoint import content_root
    from rollnet.node.delta.store import PolicyStore
    from rollnet.node.keys import dev_account
    from rollnet.node.model.builder import build_default_model
    from rollnet.node.model.loading import load_policy

    console = make_console()
    signer = dev_account(0)
    home = Path(os.environ.get("ROLLNET_HOME", Path.home() / ".rollnet")) / "models"
    base, tokenizer = load_policy(build_default_model(home))
    versions = versions_of(base, tokenizer, 6 if args.quick else 30)
    roots = {v: content_root(t) for v, t in enumerate(versions)}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        trainer = PolicyStore(Path(tmp) / "trainer", trainer=signer.address, anchor_every=10_000)
        for version, tensors in enumerate(versions):
            trainer.publish(version, tensors, signer, previous=versions[version - 1] if version else None)
        for arm, hold in (("copy of the base per version", True), ("dropped model reused", False)):
            follower = PolicyStore(Path(tmp) / arm.replace(" ", "-"), trainer=signer.address)
            follower.add_anchor(0, versions[0])
            for version in range(1, len(versions)):
                follower.add_delta(trainer.delta_path(version).read_bytes())
            rows.append({"arm": arm, **run_arm(follower.folder, signer.address, base, tokenizer, versions, roots, hold),
                         "delta_bytes_median": sorted(trainer.delta_path(v).stat().st_size
                                                      for v in range(1, len(versions)))[len(versions) // 2 - 1]})
    baseline = rows[0]["ms_per_version"]
    for row in rows:
        row["against_copy"] = row["ms_per_version"] / baseline
    table = Table(title=f"one policy version for a follower, embedded model, {len(versions) - 2} versions, 1 thread")
    for column in ("arm", "CPU ms / version", "against copy", "models reused", "delta bytes (median)"):
        table.add_column(column, justify="left" if column == "arm" else "right")
    for row in rows:
        table.add_row(row["arm"], f"{row['ms_per_version']:.1f}", f"{row['against_copy']:.2f}", str(row["reused"]),
                      f"{row['delta_bytes_median']:,}")
    console.print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"benchmark": "follower", "quick": args.quick, "rows": rows}, indent=2))
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
