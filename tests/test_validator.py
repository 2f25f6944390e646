"""The validator: the adversarial end-to-end run (real anvil, libp2p, model, SQLite), and its parts alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from eth_account import Account
from rollnet.node.chain.job import Lease, LeaseStatus
from rollnet.node.ledger import SubmissionLedger
from rollnet.node.p2p.envelopes import EnvelopeError
from rollnet.node.verdicts import VerdictBook, seal_verdict
from rollnet.validator.checks import SubmissionContext, check_submission
from test_benchmarks import run_bench

VALIDATOR, OTHER, OUTSIDER = (Account.from_key("0x" + c * 64) for c in "abc")
JOB = Account.from_key("0x" + "d" * 64).address


def test_adversaries_are_rejected_and_slashed_and_the_honest_worker_is_paid(tmp_path: Path,
                                                                             model_home: Path) -> None:
    report = run_bench("adversaries", tmp_path, {"ROLLNET_HOME": str(model_home)})
    assert len(report["cases"]) == 9
    for case in report["cases"]:
        assert case["decided"] == "rejected" and case["final_status"] == "slashed", case
        assert case["rejected"] == 1 and case["slashed_wei"] == 10**18 and case["paid_wei"] == 0, case
        assert not case["admitted_by_trainer"] and case["trainer_buffer_admitted"] == 0, case
    reasons = {case["name"]: " ".join(case["reasons"]) for case in report["cases"]}
    assert "seeded sampler" in reasons["tokens not chosen by the seeded sampler"]
    for case in ("substituted model (1e-3 noise)", "precision change (bf16)", "over-stale policy claimed as current"):
        # another model's tokens may already fail the sampling check; if they pass it, TOPLOC catches them
        assert "TOPLOC" in reasons[case] or "seeded sampler" in reasons[case], reasons[case]
    assert "claimed reward" in reasons["inflated claimed rewards"]
    assert "unavailable" in reasons["withheld data"]
    assert "leased task" in reasons["prompts other than leased"]
    assert "not this lease" in reasons["replayed earlier submission"]
    honest = report["honest"]
    assert honest["final_status"] == "paid" and honest["admitted_by_trainer"]
    assert honest["trainer_buffer_admitted"] == 8  # 2 tasks x 4 samples reach the trainer's buffer
    assert report["honest_paid_wei"] == report["lease_cost_wei"] and report["honest_slashed_wei"] == 0
    assert report["every_vote_exactly_once"]  # including the validator killed mid-verification
    # The restarted B judges what it had not, except the withheld batch: unavailable data is retried for half the
    # vote window before it counts, and is rejected in the later round.
    assert report["validator_b_after_restart"]["judged"] == 10 - report["validator_b_killed_after_fetches"] - 1
    lazy = report["collusion"]  # two validators accepted a cheat unchecked; the honest one challenged
    assert lazy["challenged"] == 1 and lazy["overturned"] and lazy["final_status"] == "slashed"
    assert lazy["lazy_voters_slashed"] == 2 and lazy["cheat_worker_slashed_wei"] == 10**18
    assert [b - a for b, a in zip(lazy["lazy_stake_before_wei"], lazy["lazy_stake_after_wei"], strict=True)] == [
        10**18, 10**18]
    assert lazy["challenger_balance_change_wei"] > 10**18  # two slashed stakes, less the 0.5 ETH bond and gas


def lease(root: bytes = b"\x01" * 32) -> Lease:
    return Lease(3, OTHER.address, 0, LeaseStatus.SUBMITTED, 0, 2, 0, 0, b"\x07" * 32, root)


def test_verdict_book_counts_only_signed_accepting_verdicts_of_active_validators() -> None:
    active = {VALIDATOR.address, OTHER.address}
    book = VerdictBook(JOB, quorum=2, is_active_validator=lambda v: v in active)
    root = b"\x01" * 32
    book.add(seal_verdict(JOB, 3, root, True, "ok", VALIDATOR))
    book.add(seal_verdict(JOB, 3, root, True, "ok", OUTSIDER))  # signed, but not a staked validator
    assert not book.admitted(3, root)
    book.add(seal_verdict(JOB, 3, root, True, "ok", OTHER))
    assert book.admitted(3, root) and not book.admitted(3, b"\x02" * 32) and not book.admitted(4, root)
    forged = seal_verdict(JOB, 5, root, True, "ok", OUTSIDER).replace(
        OUTSIDER.address.encode(), VALIDATOR.address.encode())  # claims to be a validator it is not
    with pytest.raises(EnvelopeError, match="signature"):
        book.add(forged)
    with pytest.raises(EnvelopeError, match="not"):
        book.add(seal_verdict(OTHER.address, 3, root, True, "ok", VALIDATOR))  # another job
    with pytest.raises(EnvelopeError, match="malformed"):
        book.add(b"{}")


def test_store_records_each_event_once_and_keeps_the_first_verdict(tmp_path: Path) -> None:
    store = SubmissionLedger(tmp_path / "v.sqlite")
    store.record_events(JOB, [(1, b"\x01" * 32, OTHER.address, 2)], up_to_block=10)
    store.record_events(JOB, [(1, b"\x01" * 32, OTHER.address, 2), (2, b"\x02" * 32, OTHER.address, 2)], 12)
    assert store.cursor(JOB) == 12 and [p.lease_id for p in store.unjudged(JOB)] == [1, 2]
    store.record_verdict(JOB, 1, False, "bad")
    store.record_verdict(JOB, 1, True, "changed my mind")  # ignored: a verdict never changes
    again = SubmissionLedger(tmp_path / "v.sqlite")  # a restart
    assert [(p.lease_id, p.accept, p.reason) for p in again.unattested(JOB)] == [(1, False, "bad")]
    again.mark_attested(JOB, [1])
    assert again.unattested(JOB) == [] and [p.lease_id for p in again.unjudged(JOB)] == [2]


@pytest.mark.parametrize(("data", "reason"), [
    (None, "unavailable"),
    (b"not json at all", "do not hash to the root"),
])
def test_unavailable_or_mismatched_data_is_a_rejection(data: bytes | None, reason: str) -> None:
    context = SubmissionContext(JOB, lease(), 4, 2, b"\x00" * 32, True)
    check = check_submission(data, context, None, None, None)  # type: ignore[arg-type]
    assert not check.accept and reason in check.reason


def test_malformed_submission_bytes_are_a_rejection_not_a_crash() -> None:
    from rollnet.node.p2p.objects import object_root

    data = b'{"header": {"job": 5}}'
    context = SubmissionContext(JOB, lease(object_root(data)), 4, 2, b"\x00" * 32, True)
    check = check_submission(data, context, None, None, None)  # type: ignore[arg-type]
    assert not check.accept and "malformed submission" in check.reason


def test_policies_come_from_anchor_plus_deltas_and_must_match_the_chain(tmp_path: Path, model_home: Path) -> None:
    import copy

    import torch
    from rollnet.node.delta.checkpoint import content_root
    from rollnet.node.delta.store import PolicyStore
    from rollnet.node.errors import ConfigError
    from rollnet.node.model.loading import load_policy
    from rollnet.node.model.policies import StorePolicies
    from rollnet.trainer.trainer import bf16_policy

    (folder,) = (model_home / "models").glob("addition-2digit-*")
    base, tokenizer = load_policy(folder)
    store = PolicyStore(tmp_path / "policies", trainer=VALIDATOR.address)
    versions = {0: bf16_policy(base)}
    moved = copy.deepcopy(base)
    with torch.no_grad():
        moved.model.norm.weight.add_(0.01)
    versions[1] = bf16_policy(moved)
    store.publish(0, versions[0], VALIDATOR)
    store.publish(1, versions[1], VALIDATOR, previous=versions[0])  # a delta, not an anchor
    roots = {v: content_root(t) for v, t in versions.items()}
    policies = StorePolicies(store, base, tokenizer, lambda v: roots.get(v, b"\x00" * 32))
    model, _ = policies(1)
    assert all(torch.equal(model.state_dict()[n].to(torch.bfloat16), t) for n, t in versions[1].items())
    with pytest.raises(ConfigError, match="cannot reconstruct policy version 7"):
        policies(7)
    liar = StorePolicies(store, base, tokenizer, lambda v: b"\x01" * 32)
    with pytest.raises(ConfigError, match="differs from the root published on chain"):
        liar(1)


def test_the_trainer_gate_needs_quorum_and_matching_bytes() -> None:
    from rollnet.node.p2p.objects import object_root
    from rollnet.trainer.admission import admit_submission
    from rollnet.trainer.buffer import RolloutBuffer

    data = b'{"header": {}}'
    root = object_root(data)
    book = VerdictBook(JOB, quorum=1, is_active_validator=lambda v: v == VALIDATOR.address)
    buffer = RolloutBuffer(4, 4, 16)
    assert admit_submission(data, 3, root, book, buffer) == {"no quorum": 1}
    book.add(seal_verdict(JOB, 3, root, True, "ok", VALIDATOR))
    assert admit_submission(data + b" ", 3, root, book, buffer) == {"refused": 1}  # not the bytes voted on
    assert admit_submission(data, 3, root, book, buffer) == {"refused": 1}  # accepted, yet unparseable
    assert buffer.counts.admitted == 0
