"""The validator: the adversarial end-to-end run (real anvil, libp2p, model, SQLite), and its parts alone."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from eth_account import Account
from rollnet.node.chain.anvil import AnvilProcess
from rollnet.node.chain.job import Lease, LeaseStatus, Outcome
from rollnet.node.config import Deployment
from rollnet.node.ledger import SubmissionLedger
from rollnet.node.p2p.envelopes import EnvelopeError
from rollnet.node.verdicts import Seat, VerdictBook, seal_verdict
from rollnet.validator.checks import SubmissionContext, check_submission
from test_benchmarks import run_bench

VALIDATOR, OTHER, OUTSIDER = (Account.from_key("0x" + c * 64) for c in "abc")
JOB = Account.from_key("0x" + "d" * 64).address


def test_adversaries_are_rejected_and_slashed_and_the_honest_worker_is_paid(tmp_path: Path,
                                                                             model_home: Path) -> None:
    report = run_bench("adversaries", tmp_path, {"ROLLNET_HOME": str(model_home)})
    cheats = [case for case in report["cases"] if case["kind"] == "cheat"]
    assert len(cheats) == 9
    for case in cheats:
        assert case["decided"] == "reject" and case["final_status"] == case["outcome"] == "slashed", case
        assert case["rejected"] == 1 and case["slashed_wei"] == case["collateral_wei"] == 10**18, case
        assert case["paid_wei"] == 0 and case["attacker_net_wei"] == -(10**18), case  # the whole collateral
        assert not case["admitted_by_trainer"] and case["trainer_buffer_admitted"] == 0, case
    reasons = {case["name"]: " ".join(case["reasons"]) for case in cheats}
    # A replaced token is caught by the seeded-sampling check, or first by its claimed log-prob (which the cheat
    # did not recompute) when the replacement happens to be the sampled token at an earlier position.
    caught_by = ("seeded sampler", "claimed log-prob")
    assert any(check in reasons["tokens not chosen by the seeded sampler"] for check in caught_by)
    for case in ("substituted model (1e-3 noise)", "precision change (bf16)", "over-stale policy claimed as current"):
        # another model's tokens may already fail the sampling check; if they pass it, TOPLOC catches them
        assert any(check in reasons[case] for check in ("TOPLOC", *caught_by)), reasons[case]
    assert "claimed reward" in reasons["inflated claimed rewards"]
    assert "unavailable" in reasons["withheld data"]
    assert "leased task" in reasons["prompts other than leased"]
    assert "not this lease" in reasons["replayed earlier submission"]
    honest = report["honest"]
    assert honest["final_status"] == "paid" and honest["admitted_by_trainer"]
    assert honest["trainer_buffer_admitted"] == 8  # 2 tasks x 4 samples reach the trainer's buffer
    assert report["honest_paid_wei"] == report["lease_cost_wei"] and report["honest_slashed_wei"] == 0
    assert honest["attacker_net_wei"] == 0  # its wage and nothing else: never slashed
    assert report["gas_per_accepted_sample"] > 0
    assert report["every_vote_exactly_once"]  # including the validator killed mid-verification
    assert all(case["votes"] == [1, 1] for case in [honest, *cheats])
    # The restarted B judges what it had not, except the withheld batch: unavailable data is retried for half the
    # vote window before it counts, and is rejected in the later run. It votes its old and new verdicts at once.
    killed_after = report["validator_b_killed_after_fetches"]
    assert report["validator_b_after_restart"] == {"judged": 10 - killed_after - 1, "attested": 10 - 1}

    for case in report["cases"]:  # no attack pays, and no honest party loses (gas excluded)
        assert case["attacker_net_wei"] <= 0 and case["honest_loss_wei"] == 0, case
    partial = [case for case in report["cases"] if case["kind"] == "partial"]
    assert [case["faked_per_lease"] for case in partial] == [1, 8, 32]
    for case in partial:  # sampled verification: each caught, at a loss; no validator slashed for a sampled accept
        assert case["caught"] and case["attacker_net_wei"] < 0, case
        assert case["leases"] <= 40 and 0 < case["catch_probability"] <= 1, case
    assert report["partial"]["slashed_validators"] == 0
    assert -report["partial"]["requester_net_wei"] == sum(c["requester_paid_for_fakes_wei"] for c in partial)
    economic = [case for case in report["cases"] if case["kind"] == "economic"]
    for word in ("requester", "collusion", "appeal", "hoard", "grind", "squat"):
        assert any(word in case["name"] for case in economic), word
    attack = {case["attack"]: case for case in economic if case["attack"] != "collusion"}
    requester = attack["requester"]
    assert "InvalidSpec" in requester["refused_spec"] and requester["refunds_only_unreserved"]
    assert requester["requester_slashed_wei"] > 0 and requester["requester_bonds_lost_wei"] > 0
    assert requester["attacker_net_wei"] < 0
    griefing = attack["appeal"]
    assert griefing["honest_paid_wei"] > 0 and griefing["griefer_bonds_lost_wei"] > 0 > griefing["attacker_net_wei"]
    assert griefing["pay_delay_s"] > griefing["undisputed_pay_delay_s"]  # paid in full, only later
    hoard = attack["hoard"]
    assert hoard["held"] == hoard["stake_wei"] // hoard["slash_wei"] and "InsufficientActiveStake" in hoard[
        "refused_beyond"]
    assert hoard["honest_leases_paid"] == 2 and hoard["honest_worker_got_returned_tasks"]
    assert hoard["fees_burned_wei"] == hoard["held"] * hoard["fee_wei"] == -hoard["attacker_net_wei"]
    grind = attack["grind"]
    assert grind["seeds_at_claim_zero"] and all("RandomnessNotReady" in r for r in grind["draw_seed_in_claim_block"])
    assert grind["abandoned"] >= 1 and grind["attacker_net_wei"] == -grind["abandoned"] * grind["fee_wei"]
    squat = attack["squat"]
    assert all("PeerSignatureInvalid" in r for r in squat["refusals"].values()) and squat["victim_owns_peer_id"]
    sweep = report["collusion_sweep"]
    minority = [point for point in sweep if point["share"] < 0.5]
    assert minority and any(point["share"] > 0.5 for point in sweep)
    for point in minority:  # below half the stake, colluders lose and every final outcome is right
        assert point["colluders_net_wei"] <= 0 and point["honest_loss_wei"] == 0, point
        assert point["wrong_final_outcomes"] == 0, point
    assert sorted(c["share"] for c in economic if c["attack"] == "collusion") == sorted(p["share"] for p in minority)
    assert report["collusion_wins_from_share"] > 0.5  # the final round is a vote of every validator by stake


def lease(root: bytes = b"\x01" * 32) -> Lease:
    return Lease(3, OTHER.address, LeaseStatus.VOTING, Outcome.PENDING, 0, 0, 2, 0, 0, b"\x07" * 32, root)


class Committee:
    """A first committee as the verdict book sees it: seats (vote weight, own stake) of a total, and whether
    its vote window has closed."""

    def __init__(self, seats: dict[str, tuple[int, int]], total: int, closed: bool = False):
        self.seats, self.total, self.closed = seats, total, closed

    def seat(self, lease_id: int, validator: str) -> Seat:
        weight, stake = self.seats.get(validator, (0, 0)) if lease_id == 3 else (0, 0)
        return Seat(weight, stake, self.total if lease_id == 3 else 0)

    def vote_closed(self, lease_id: int) -> bool:
        return self.closed

    def objected(self, lease_id: int) -> bool:
        return False

    def accepted_on_chain(self, lease_id: int, root: bytes) -> list[str]:
        return []


def test_verdict_book_needs_accepting_members_holding_more_than_half_the_weight() -> None:
    book = VerdictBook(JOB, Committee({VALIDATOR.address: (40, 40), OTHER.address: (30, 30)}, total=100))
    root = b"\x01" * 32
    book.add(seal_verdict(JOB, 3, root, True, "ok", VALIDATOR))
    book.add(seal_verdict(JOB, 3, root, True, "ok", OUTSIDER))  # signed, but not on the committee
    assert not book.admitted(3, root)  # 40 of 100
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


def test_a_sampled_minority_is_admitted_only_after_the_vote_window_and_never_over_an_objection() -> None:
    """Two sampled members vote with weight total/k each (66 of 100) while holding 20% of the stake: the book
    waits for the vote window, so the other members had their chance to object; any objection blocks it."""
    root = b"\x01" * 32
    seats = {VALIDATOR.address: (33, 10), OTHER.address: (33, 10), OUTSIDER.address: (33, 40)}
    book = VerdictBook(JOB, committee := Committee(seats, total=100))
    for signer in (VALIDATOR, OTHER):
        book.add(seal_verdict(JOB, 3, root, True, "ok", signer))
    assert not book.admitted(3, root)  # a weight majority, but 20% of the stake: wait
    committee.closed = True
    assert book.admitted(3, root)  # the window closed without an objection
    book.add(seal_verdict(JOB, 3, root, False, "TOPLOC", OUTSIDER))
    assert not book.admitted(3, root) and book.rejections(3, root) == [OUTSIDER.address]


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


def test_store_lets_a_full_audit_replace_only_a_sampled_accept(tmp_path: Path) -> None:
    """A sample proves a fake, never a good batch: a sampled accept gives way once to an appeal round's full
    audit; a sampled reject, or any full verdict, never changes; and a ledger written before sampling existed
    (no `audited` column) reads its verdicts as full ones."""
    store = SubmissionLedger(tmp_path / "v.sqlite")
    store.record_events(JOB, [(i, bytes([i]) * 32, OTHER.address, 2) for i in (1, 2, 3)], up_to_block=10)
    store.record_verdict(JOB, 1, True, "ok", audited=8)
    store.record_verdict(JOB, 1, True, "ok again", audited=8)  # another sample: no
    assert [(p.accept, p.sampled_accept) for p in store.all(JOB) if p.lease_id == 1] == [(True, True)]
    store.record_verdict(JOB, 1, False, "task 4 sample 2: TOPLOC mismatch")  # the full audit
    store.record_verdict(JOB, 1, True, "ok", audited=None)  # and nothing after it
    store.record_verdict(JOB, 2, False, "task 1 sample 0: bad", audited=8)
    store.record_verdict(JOB, 2, True, "ok")  # a sampled reject found a fake: it stands
    store.record_verdict(JOB, 3, True, "ok")
    store.record_verdict(JOB, 3, False, "no", audited=None)
    rows = {p.lease_id: (p.accept, p.reason, p.audited) for p in SubmissionLedger(tmp_path / "v.sqlite").all(JOB)}
    assert rows == {1: (False, "task 4 sample 2: TOPLOC mismatch", None), 2: (False, "task 1 sample 0: bad", 8),
                    3: (True, "ok", None)}
    old = tmp_path / "old.sqlite"
    with sqlite3.connect(old) as connection:
        connection.execute("CREATE TABLE submissions (job VARCHAR(42) NOT NULL, lease_id INTEGER NOT NULL, "
                           "root BLOB, worker VARCHAR(42), policy_version INTEGER, accept BOOLEAN, reason VARCHAR, "
                           "attested BOOLEAN, PRIMARY KEY (job, lease_id))")
        connection.execute("INSERT INTO submissions VALUES (?, 1, ?, ?, 2, 1, 'ok', 0)",
                           (JOB.lower(), b"\x01" * 32, OTHER.address))
    (row,) = SubmissionLedger(old).all(JOB)
    assert (row.accept, row.audited, row.sampled_accept) == (True, None, False)


def test_store_follows_rounds_forward_and_forgets_the_old_membership(tmp_path: Path) -> None:
    store = SubmissionLedger(tmp_path / "v.sqlite")
    store.record_events(JOB, [(1, b"\x01" * 32, OTHER.address, 2)], up_to_block=10)
    store.set_membership(JOB, 1, 0, 7 * 10**18)
    store.mark_voted(JOB, 1, 0)
    (row,) = store.open_rows(JOB)
    assert (row.round, row.member_weight, row.voted_round, row.member) == (0, 7 * 10**18, 0, True)
    store.record_events(JOB, [], up_to_block=11, appeals=[(1, 1)])
    store.set_membership(JOB, 1, 0, 5)  # a late answer for the old round changes nothing
    (row,) = SubmissionLedger(tmp_path / "v.sqlite").open_rows(JOB)
    assert (row.round, row.member_weight, row.voted_round) == (1, None, 0)
    store.record_events(JOB, [], up_to_block=12, appeals=[(1, 0)])  # rounds never move back
    store.mark_voted(JOB, 1, -1)  # nor do votes
    (row,) = store.open_rows(JOB)
    assert (row.round, row.voted_round) == (1, 0)
    store.close(JOB, 1)
    assert store.open_rows(JOB) == [] and len(store.all(JOB)) == 1


def test_store_hands_each_stage_only_the_rows_it_has_work_on(tmp_path: Path) -> None:
    """A pass asks the ledger per stage: rows not placed on a committee yet, rows to judge (no verdict, or a
    sampled accept in an appeal round), rows to vote (a verdict, a round not voted, never a sampled accept in
    an appeal round), and rows an appeal may stand on (never a sampled accept). Closed rows are in none."""
    store = SubmissionLedger(tmp_path / "v.sqlite")
    assert store.record_events(JOB, [(i, bytes([i]) * 32, OTHER.address, 2) for i in range(1, 7)], 10) == 6
    assert store.record_events(JOB, [(6, b"\x06" * 32, OTHER.address, 2), (7, b"\x07" * 32, OTHER.address, 2)],
                               11) == 1  # one new submission; the replayed one is not counted again
    for lease_id, weight in ((1, 0), (2, 5), (3, 5), (4, 5), (5, 5)):
        store.set_membership(JOB, lease_id, 0, weight)
    store.record_verdict(JOB, 3, True, "ok", audited=8)  # a sampled accept in round 0: voted, not appealed on
    store.record_verdict(JOB, 4, False, "task 1 sample 0: bad", audited=8)
    store.mark_voted(JOB, 4, 0)
    store.record_verdict(JOB, 5, True, "ok", audited=8)
    store.record_events(JOB, [], 12, appeals=[(5, 1)])  # round 1 drew us again: judge it in full, never vote it
    store.set_membership(JOB, 5, 1, 5)
    store.close(JOB, 7)

    def ids(rows: list) -> list[int]:
        return [row.lease_id for row in rows]

    assert ids(store.undrawn(JOB)) == [6]
    assert ids(store.to_judge(JOB)) == [2, 5]
    assert ids(store.to_vote(JOB)) == [3]
    assert ids(store.contestable(JOB)) == [4]
    assert ids(store.open_rows(JOB)) == [1, 2, 3, 4, 5, 6]


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
    # A version reached by advancing from the head (not rebuilt and hashed) is held to the chain's root too.
    liar = StorePolicies(store, base, tokenizer, lambda v: roots[0] if v == 0 else b"\x01" * 32)
    liar(0)
    with pytest.raises(ConfigError, match="differs from the root published on chain"):
        liar(1)


def test_a_follower_reaches_each_version_by_one_delta_and_keeps_every_version(tmp_path: Path, model_home: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A follower's store holds the job's base as its only anchor. Reaching version v must not replay every delta
    since it (a run's whole history, at every version): each new version costs its own delta, and every
    version stays reachable (a validator may need an old one for an appeal)."""
    import copy

    import torch
    from rollnet.node.delta import store as store_module
    from rollnet.node.delta.checkpoint import content_root
    from rollnet.node.delta.store import PolicyStore
    from rollnet.node.model.loading import load_policy
    from rollnet.node.model.policies import StorePolicies
    from rollnet.trainer.trainer import bf16_policy

    (folder,) = (model_home / "models").glob("addition-2digit-*")
    base, tokenizer = load_policy(folder)
    trainer = PolicyStore(tmp_path / "trainer", trainer=VALIDATOR.address)
    follower = PolicyStore(tmp_path / "follower", trainer=VALIDATOR.address)
    versions = {0: bf16_policy(base)}
    trainer.publish(0, versions[0], VALIDATOR)
    follower.add_anchor(0, versions[0])
    moved = copy.deepcopy(base)
    for version in range(1, 14):
        with torch.no_grad():
            moved.model.norm.weight.add_(0.01)
        versions[version] = bf16_policy(moved)
        trainer.publish(version, versions[version], VALIDATOR, previous=versions[version - 1])
        follower.add_delta(trainer.delta_path(version).read_bytes())
    roots = {v: content_root(t) for v, t in versions.items()}
    applied: list[int] = []
    real_apply = store_module.apply

    def counting_apply(*args: object, **kwargs: object) -> object:
        applied.append(1)
        return real_apply(*args, **kwargs)

    monkeypatch.setattr(store_module, "apply", counting_apply)
    policies = StorePolicies(follower, base, tokenizer, roots.__getitem__)
    for version in range(1, 13):
        model, _ = policies(version)
        assert all(torch.equal(model.state_dict()[n].to(torch.bfloat16), t) for n, t in versions[version].items())
    assert len(applied) == 12  # one delta per version (rebuilt from the base each time: 78)
    assert follower.anchors == [0] and all(follower.reaches(0, v) for v in versions)  # nothing pruned
    older, _ = policies(2)  # an old version (an appeal's) is rebuilt from the base; the newest stays the head
    assert all(torch.equal(older.state_dict()[n].to(torch.bfloat16), t) for n, t in versions[2].items())
    applied.clear()
    newer, _ = policies(13)
    assert len(applied) == 1  # from the head, version 12
    assert all(torch.equal(newer.state_dict()[n].to(torch.bfloat16), t) for n, t in versions[13].items())


def test_the_trainer_gate_needs_the_committee_and_matching_bytes() -> None:
    from rollnet.node.p2p.objects import object_root
    from rollnet.trainer.admission import admit_submission
    from rollnet.trainer.buffer import RolloutBuffer

    data = b'{"header": {}}'
    root = object_root(data)
    book = VerdictBook(JOB, Committee({VALIDATOR.address: (60, 60)}, total=100))
    buffer = RolloutBuffer(4, 4, 16)
    assert admit_submission(data, 3, root, book, buffer) == {"no quorum": 1}
    book.add(seal_verdict(JOB, 3, root, True, "ok", VALIDATOR))
    assert admit_submission(data + b" ", 3, root, book, buffer) == {"refused": 1}  # not the bytes voted on
    assert admit_submission(data, 3, root, book, buffer) == {"refused": 1}  # accepted, yet unparseable
    assert buffer.counts.admitted == 0


def test_a_member_outvoted_before_it_could_vote_still_judges_the_round_and_appeals_it(
        market: Deployment, anvil: AnvilProcess, model_home: Path, tmp_path: Path) -> None:
    """Two colluding members accept a batch with inflated rewards in the block after submission, deciding
    round 0 at once (2 of 3 equal stakes). The honest member's daemon has not voted and cannot any more, yet
    it judges the decided round and appeals it, so the decision cannot pass unseen."""
    from conftest import ETH, REPO, client_for
    from rollnet.node.chain.job import FactoryClient, JobClient
    from rollnet.node.chain.registry import RegistryClient, Role
    from rollnet.node.delta.checkpoint import content_root
    from rollnet.node.delta.store import PolicyStore
    from rollnet.node.model.loading import load_policy
    from rollnet.node.model.policies import StorePolicies
    from rollnet.node.p2p.fetch import p2p_fetcher
    from rollnet.node.p2p.host import P2PNode
    from rollnet.node.p2p.identity import load_or_create_identity
    from rollnet.node.p2p.objects import ObjectStore, object_root
    from rollnet.node.rollout.generate import generate
    from rollnet.node.spec import load_job_spec
    from rollnet.node.tasks import load_task
    from rollnet.node.worker import claim_with_seed, leased_instances, submission_bytes
    from rollnet.trainer.trainer import bf16_policy
    from rollnet.validator.daemon import ValidatorDaemon

    (folder,) = (model_home / "models").glob("addition-2digit-*")
    base, tokenizer = load_policy(folder)
    task = load_task("addition-2digit")
    requester = client_for(anvil, 0)
    spec = load_job_spec(REPO / "examples" / "job.toml").model_copy(
        update={"group_size": 4, "tasks_per_lease": 2, "appeal_rounds": 1})
    nodes = {name: P2PNode(load_or_create_identity(tmp_path / name), ObjectStore(tmp_path / name / "objects"),
                           gate=None).start() for name in ("worker", "honest")}
    try:
        accounts = {"worker": 1, "honest": 2, "colluder-a": 3, "colluder-b": 4}
        for name, index in accounts.items():
            registry = RegistryClient(client_for(anvil, index), market.registry)
            identity = nodes[name].identity if name in nodes else load_or_create_identity(tmp_path / name)
            registry.join(identity, Role.WORKER if name == "worker" else Role.VALIDATOR, 10 * ETH)
            if name in nodes:
                registry.set_listen_addrs([nodes[name].addr.split("/p2p/")[0]])
        address = FactoryClient(requester, market.factory).create_job(spec.to_abi(requester.address), 2 * ETH)
        weights = bf16_policy(base)
        store = PolicyStore(tmp_path / "policies", trainer=requester.address)
        store.publish(1, weights, requester.account)
        JobClient(requester, address).publish_policy(1, content_root(weights))

        worker = JobClient(client_for(anvil, 1), address)
        lease = claim_with_seed(worker)
        rollouts = generate(base, tokenizer, leased_instances(task, lease, spec.tasks_per_lease), spec.group_size,
                            max_new_tokens=6, policy_version=1, policy_root=content_root(weights).hex())
        rewards = [task.reward(task.instance(r.task_seed), r.text) + 0.5 for r in rollouts]  # inflated
        data = submission_bytes(address, lease, worker.client.account, task, rollouts, 1, rewards)
        nodes["worker"].store.put(data)
        worker.submit(lease.lease_id, object_root(data), 1)
        for colluder in (3, 4):
            JobClient(client_for(anvil, colluder), address).vote(lease.lease_id, True)
        assert worker.lease(lease.lease_id).outcome is Outcome.ACCEPT  # decided before the honest member voted

        honest = client_for(anvil, 2)
        gossip: list[bytes] = []
        daemon = ValidatorDaemon(JobClient(honest, address), RegistryClient(honest, market.registry),
                                 honest.account, task, StorePolicies(store, base, tokenizer,
                                                                     worker.policy_root),
                                 p2p_fetcher(nodes["honest"], RegistryClient(honest, market.registry)),
                                 SubmissionLedger(tmp_path / "honest.sqlite"), publish=gossip.append)
        report = daemon.run_once()
        assert (report.drawn, report.judged, report.attested, report.appealed) == (1, 1, 0, 1)
        (row,) = daemon.store.all(address)
        assert row.accept is False and "claimed reward" in row.reason
        assert len(gossip) == 1  # its rejection is gossiped, so a trainer sees a member objecting
        appealed = worker.lease(lease.lease_id)
        assert (appealed.status, appealed.round) == (LeaseStatus.VOTING, 1)
        assert worker.round(lease.lease_id, 1).appellant == honest.address
    finally:
        for node in nodes.values():
            node.stop()
