"""Cheating workers against two validators, end to end: a real anvil and the contracts, libp2p hosts on
127.0.0.1, the default model, and the validator daemon with its SQLite store.

One honest worker and nine adversaries (test code, not product flags) each claim one lease of the same
job at policy version 2 and submit: fabricated completions, a substituted model (1e-3 weight noise), a
precision change (bf16), tokens not chosen by the seeded sampler (teacher-forced answers), an over-stale
policy (version 1 weights claimed as version 2), a replay of the honest worker's earlier submission,
inflated claimed rewards, withheld data, and rollouts for prompts other than the leased ones. Validator
B is killed mid-verification and restarted from its store. Every lease is then decided, the challenge
window passes, and each lease is finalized: the honest worker must be paid in full and never slashed,
every adversary rejected and slashed. Also: each validator's vote appears exactly once per lease on chain,
and the trainer's verdict book admits exactly the honest batch. Then, on a second job, two lazy validators
accept a cheat without checking and reach quorum first; validator A (who did not vote) challenges, the
arbiter re-checks and overturns, and A's daemon slashes both lazy voters.

Usage: python bench/adversaries.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path

import torch
from rich.table import Table
from rollnet.node.chain.anvil import start_anvil
from rollnet.node.chain.client import ChainClient
from rollnet.node.chain.deploy import RegistryParams, deploy_market
from rollnet.node.chain.job import FactoryClient, JobClient, LeaseStatus
from rollnet.node.chain.registry import RegistryClient, Role
from rollnet.node.cli.context import make_console
from rollnet.node.config import resolve_data_dir
from rollnet.node.delta.checkpoint import content_root
from rollnet.node.delta.store import PolicyStore
from rollnet.node.keys import dev_account
from rollnet.node.ledger import SubmissionLedger
from rollnet.node.model.builder import _batch, build_default_model
from rollnet.node.model.loading import load_policy
from rollnet.node.model.policies import StorePolicies
from rollnet.node.p2p.fetch import p2p_fetcher
from rollnet.node.p2p.host import P2PNode
from rollnet.node.p2p.identity import load_or_create_identity
from rollnet.node.p2p.objects import ObjectStore, object_root
from rollnet.node.rollout.generate import generate
from rollnet.node.spec import JobSpecFile
from rollnet.node.tasks import load_task
from rollnet.node.verdicts import VerdictBook, seal_verdict
from rollnet.node.worker import leased_instances, submission_bytes
from rollnet.trainer.admission import admit_submission
from rollnet.trainer.buffer import RolloutBuffer
from rollnet.trainer.trainer import bf16_policy
from rollnet.validator.checks import SubmissionContext, check_submission
from rollnet.validator.daemon import ValidatorDaemon

ETH = 10**18
TASK = load_task("addition-2digit")
REQUESTER, VALIDATOR_A, VALIDATOR_B = 0, 1, 2
CASES = ["honest", "fabricated completions", "substituted model (1e-3 noise)", "precision change (bf16)",
         "tokens not chosen by the seeded sampler", "over-stale policy claimed as current",
         "replayed earlier submission", "inflated claimed rewards", "withheld data", "prompts other than leased"]


def rounded(model: torch.nn.Module) -> torch.nn.Module:
    """The model as workers run a published bf16 policy: weights rounded to bf16, computed in fp32."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for tensor in out.state_dict().values():
            tensor.copy_(tensor.to(torch.bfloat16))
    return out.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description="Adversarial workers against the validator daemon.")
    parser.add_argument("--quick", action="store_true", help="the same scenario (it is already small)")
    parser.add_argument("--json", type=Path, default=Path("bench/results/adversaries.json"))
    args = parser.parse_args()
    console = make_console()
    torch.set_num_threads(2)
    started = time.perf_counter()
    folder = build_default_model(resolve_data_dir(None) / "models")
    base, tokenizer = load_policy(folder)
    v1 = rounded(base)
    newer = copy.deepcopy(v1).train()
    optimizer = torch.optim.AdamW(newer.parameters(), lr=1e-3)
    ids, labels = _batch(TASK, tokenizer, range(60_000, 60_128))
    newer(input_ids=ids, labels=labels).loss.backward()
    optimizer.step()
    v2 = rounded(newer)
    roots = {v: content_root(bf16_policy(m)) for v, m in ((1, v1), (2, v2))}

    anvil = start_anvil()
    nodes: list[P2PNode] = []
    work = Path(tempfile.mkdtemp(prefix="rollnet-adversaries-"))
    try:
        requester = ChainClient(anvil.url, dev_account(REQUESTER))
        market = deploy_market(requester, RegistryParams(unbonding_period_seconds=86_400))

        def host(name: str, index: int, role: Role, stake: int) -> tuple[ChainClient, P2PNode]:
            client = ChainClient(anvil.url, dev_account(index))
            node = P2PNode(load_or_create_identity(work / name), ObjectStore(work / name / "objects"),
                           gate=None).start()
            nodes.append(node)
            registry = RegistryClient(client, market.registry)
            registry.join(node.identity.peer_id_bytes, role, stake)
            registry.set_listen_addrs([node.addr])
            return client, node

        validators = {name: host(name, index, Role.VALIDATOR, 10 * ETH)
                      for name, index in (("validator-a", VALIDATOR_A), ("validator-b", VALIDATOR_B))}
        workers = {case: host(f"worker-{i}", 3 + i, Role.WORKER, 5 * ETH) for i, case in enumerate(CASES)}
        spec = JobSpecFile(model="embedded", task=TASK.name, trainer="self", arbiter="self", group_size=4,
                           tasks_per_lease=2, max_staleness=4, quorum=2, clip_epsilon=0.2, clip_delta=4.0,
                           lease_seconds=600, vote_seconds=600, challenge_seconds=3600, resolve_seconds=3600,
                           reward_per_sample_eth="0.001", slash_eth="1", challenge_bond_eth="0.5")
        job_address = FactoryClient(requester, market.factory).create_job(spec.to_abi(requester.address), 2 * ETH)
        trainer_job = JobClient(requester, job_address)
        # The trainer stores version 1 as an anchor and version 2 as a signed delta; validators rebuild
        # each claimed version from them and check it against the root published on chain.
        policy_store = PolicyStore(work / "policies", trainer=requester.address)
        policy_store.publish(1, bf16_policy(v1), requester.account)
        policy_store.publish(2, bf16_policy(v2), requester.account, previous=bf16_policy(v1))
        for version in (1, 2):
            trainer_job.publish_policy(version, roots[version])
        policies = StorePolicies(policy_store, base, tokenizer, trainer_job.policy_root)
        registry = RegistryClient(requester, market.registry)
        stake_before = {case: registry.info(client.address).active for case, (client, _) in workers.items()}

        # ---------------------------------------------------------------- workers submit
        submitted: dict[str, int] = {}
        submitted_bytes: dict[str, bytes] = {}
        honest_bytes = b""
        for case in CASES:
            client, node = workers[case]
            job = JobClient(client, job_address)
            lease = job.claim()
            instances = leased_instances(TASK, lease, spec.tasks_per_lease)
            model = v2
            if case == "substituted model (1e-3 noise)":
                model = copy.deepcopy(v2)
                with torch.no_grad():
                    for parameter in model.parameters():
                        parameter.mul_(1 + 1e-3 * torch.randn_like(parameter))
            elif case == "precision change (bf16)":
                model = copy.deepcopy(v2).to(torch.bfloat16)
            elif case == "over-stale policy claimed as current":
                model = v1
            elif case == "prompts other than leased":
                instances = [TASK.instance(i.seed + 1) for i in instances]
            rollouts = generate(model, tokenizer, instances, spec.group_size, max_new_tokens=6, policy_version=2,
                                policy_root=roots[2].hex())
            rewards = [TASK.reward(TASK.instance(r.task_seed), r.text) for r in rollouts]
            if case == "fabricated completions":
                generator = torch.Generator().manual_seed(1)
                for r in rollouts:
                    r.tokens = torch.randint(0, len(tokenizer), (len(r.tokens),), generator=generator).tolist()
                    r.text = tokenizer.decode(r.tokens, skip_special_tokens=True)
                rewards = [TASK.reward(TASK.instance(r.task_seed), r.text) for r in rollouts]
            elif case == "tokens not chosen by the seeded sampler":
                for index, r in enumerate(rollouts):  # writes the right answers (and one wrong one) itself
                    answer = TASK.instance(r.task_seed).answer
                    r.text = answer if index else str(int(answer) + 1)
                    r.tokens = tokenizer.encode(r.text) + [tokenizer.eos_token_id]
                    r.logprobs = [0.0] * len(r.tokens)
                rewards = [TASK.reward(TASK.instance(r.task_seed), r.text) for r in rollouts]
            elif case == "inflated claimed rewards":
                rewards = [reward + 0.5 for reward in rewards]
            data = submission_bytes(job_address, lease, client.account, TASK, rollouts, 2, rewards)
            if case == "honest":
                honest_bytes = data
            if case == "replayed earlier submission":
                data = honest_bytes  # someone else's signed batch, fetched from the swarm and resubmitted
            root = object_root(data)
            if case != "withheld data":
                node.store.put(data)
            job.submit(lease.lease_id, root, 2)
            submitted[case] = lease.lease_id
            submitted_bytes[case] = data

        # ---------------------------------------------------------------- validators judge and vote
        book = VerdictBook(job_address, spec.quorum, lambda v: registry.is_active(v, Role.VALIDATOR))
        gossip: list[bytes] = []

        def daemon(name: str, fetch_limit: int | None = None) -> ValidatorDaemon:
            client, node = validators[name]
            fetch = p2p_fetcher(node, RegistryClient(client, market.registry), timeout_s=5)
            if fetch_limit is not None:
                calls = {"n": 0}
                real_fetch = fetch

                def fetch(root: bytes, worker: str) -> bytes | None:  # dies on its (limit+1)-th fetch
                    calls["n"] += 1
                    if calls["n"] > fetch_limit:
                        raise KeyboardInterrupt("validator killed mid-verification")
                    return real_fetch(root, worker)

            return ValidatorDaemon(JobClient(client, job_address), RegistryClient(client, market.registry),
                                   client.account, TASK, policies, fetch,
                                   SubmissionLedger(work / name / "validator.sqlite"), publish=gossip.append)

        daemon("validator-a").run_once()
        killed_after = 4
        try:
            daemon("validator-b", fetch_limit=killed_after).run_once()
        except KeyboardInterrupt:
            pass
        restarted = daemon("validator-b").run_once()
        # Data that cannot be fetched is retried for half the vote window before it counts as withheld.
        requester.rpc("evm_increaseTime", [spec.vote_seconds // 2 + 1])
        requester.rpc("evm_mine", [])
        for name in validators:
            daemon(name).run_once()
        for data in gossip:
            book.add(data)
        forged = seal_verdict(job_address, submitted["inflated claimed rewards"],
                              JobClient(requester, job_address).lease(submitted["inflated claimed rewards"]).root,
                              True, "ok", workers["honest"][0].account)  # a worker is not a validator
        book.add(forged)

        # ---------------------------------------------------------------- lazy validators, caught by a challenge
        # A second job where two validators accept without checking and reach quorum on a cheat first. The
        # honest validator A, who did not get to vote, challenges; the arbiter re-checks and overturns; A's
        # daemon then slashes both lazy voters (their stake goes to A, the challenger).
        job2 = FactoryClient(requester, market.factory).create_job(spec.to_abi(requester.address), 2 * ETH)
        for version in (1, 2):
            JobClient(requester, job2).publish_policy(version, roots[version])
        lazy = [ChainClient(anvil.url, dev_account(i)) for i in (13, 14)]
        for index, client in enumerate(lazy):
            RegistryClient(client, market.registry).join(f"lazy-{index}".encode(), Role.VALIDATOR, 10 * ETH)
        lazy_before = [registry.info(c.address).active for c in lazy]
        cheat_client, cheat_node = host("worker-collusion", 15, Role.WORKER, 5 * ETH)
        cheat_job = JobClient(cheat_client, job2)
        cheat_lease = cheat_job.claim()
        noisy = copy.deepcopy(v2)
        with torch.no_grad():
            for parameter in noisy.parameters():
                parameter.mul_(1 + 1e-3 * torch.randn_like(parameter))
        cheat_rollouts = generate(noisy, tokenizer, leased_instances(TASK, cheat_lease, spec.tasks_per_lease),
                                  spec.group_size, max_new_tokens=6, policy_version=2, policy_root=roots[2].hex())
        cheat_data = submission_bytes(job2, cheat_lease, cheat_client.account, TASK, cheat_rollouts, 2)
        cheat_node.store.put(cheat_data)
        cheat_job.submit(cheat_lease.lease_id, object_root(cheat_data), 2)
        cheat_stake_before = registry.info(cheat_client.address).active
        for client in lazy:
            JobClient(client, job2).attest(cheat_lease.lease_id, True)
        client_a, node_a = validators["validator-a"]
        challenger = ValidatorDaemon(JobClient(client_a, job2), RegistryClient(client_a, market.registry),
                                     client_a.account, TASK, policies,
                                     p2p_fetcher(node_a, RegistryClient(client_a, market.registry), timeout_s=5),
                                     SubmissionLedger(work / "validator-a" / "job2.sqlite"))
        balance_a_before = requester.balance(client_a.address)
        first_round = challenger.run_once()
        arbiter = JobClient(requester, job2)
        arbiter_check = check_submission(cheat_data, SubmissionContext(
            job2, arbiter.lease(cheat_lease.lease_id), spec.group_size, spec.tasks_per_lease, roots[2], True),
            TASK, *policies(2))
        arbiter.resolve(cheat_lease.lease_id, arbiter_check.accept)
        second_round = challenger.run_once()
        state = arbiter.challenge_state(cheat_lease.lease_id)
        collusion = {
            "challenged": first_round.challenged, "overturned": state.overturned,
            "arbiter_reason": arbiter_check.reason, "lazy_voters_slashed": second_round.slashed_voters,
            "lazy_stake_before_wei": lazy_before,
            "lazy_stake_after_wei": [registry.info(c.address).active for c in lazy],
            "cheat_worker_slashed_wei": cheat_stake_before - registry.info(cheat_client.address).active,
            "challenger_balance_change_wei": requester.balance(client_a.address) - balance_a_before,
            "final_status": arbiter.lease(cheat_lease.lease_id).status.name.lower(),
        }

        # The trainer's buffer takes a batch only with the verdict quorum (and the bytes matching the root).
        buffer = RolloutBuffer(spec.group_size, spec.max_staleness, v2.config.vocab_size)
        buffer.advance(2)
        trainer_admitted = {case: admit_submission(submitted_bytes[case], lease_id,
                                                   JobClient(requester, job_address).lease(lease_id).root, book,
                                                   buffer)["admitted"]
                            for case, lease_id in submitted.items()}

        # ---------------------------------------------------------------- settle
        chain = JobClient(requester, job_address)
        decided = {case: chain.lease(lease_id).status for case, lease_id in submitted.items()}
        requester.rpc("evm_increaseTime", [3601])
        requester.rpc("evm_mine", [])
        for lease_id in submitted.values():
            chain.finalize(lease_id)
        attested = chain.client.events(chain.contract, "Attested", 0)
        votes_per = {}
        for log_ in attested:
            key = (log_["args"]["leaseId"], log_["args"]["validator"])
            votes_per[key] = votes_per.get(key, 0) + 1
        validator_addresses = [client.address for client, _ in validators.values()]
        cases = []
        lease_cost = spec.group_size * spec.tasks_per_lease * 10**15
        for case, lease_id in submitted.items():
            client = workers[case][0]
            lease = chain.lease(lease_id)
            slashed = stake_before[case] - registry.info(client.address).active
            reasons = sorted({row.reason for name in validators
                              for row in SubmissionLedger(work / name / "validator.sqlite").all(job_address)
                              if row.lease_id == lease_id})
            cases.append({
                "name": case, "honest": case == "honest", "submissions": 1,
                "rejected": int(lease.status is LeaseStatus.SLASHED), "decided": decided[case].name.lower(),
                "final_status": lease.status.name.lower(), "slashed_wei": slashed,
                "paid_wei": chain.owed(client.address), "stake_before_wei": stake_before[case],
                "stake_after_wei": stake_before[case] - slashed, "reasons": reasons,
                "votes": [votes_per.get((lease_id, v), 0) for v in validator_addresses],
                "admitted_by_trainer": book.admitted(lease_id, lease.root),
                "trainer_buffer_admitted": trainer_admitted[case],
            })
        honest = next(c for c in cases if c["honest"])
        report = {
            "benchmark": "adversaries", "quick": args.quick, "cases": [c for c in cases if not c["honest"]],
            "honest": honest, "honest_paid_wei": honest["paid_wei"], "honest_slashed_wei": honest["slashed_wei"],
            "lease_cost_wei": lease_cost, "validator_b_killed_after_fetches": killed_after,
            "validator_b_after_restart": {"judged": restarted.judged, "attested": restarted.attested},
            "every_vote_exactly_once": all(n == 1 for c in cases for n in c["votes"]),
            "gossiped_verdicts": len(gossip), "collusion": collusion, "seconds": time.perf_counter() - started,
        }
    finally:
        for node in nodes:
            node.stop()
        anvil.stop()

    table = Table(title="adversarial workers: 1 lease each (2 tasks x 4 samples), 2 validators, quorum 2")
    for column in ("case", "decided", "final", "slashed ETH", "paid ETH", "votes A/B", "trainer buffer",
                   "first reason"):
        table.add_column(column)
    for case in [honest, *report["cases"]]:
        table.add_row(case["name"], case["decided"], case["final_status"], f"{case['slashed_wei'] / ETH:g}",
                      f"{case['paid_wei'] / ETH:g}", "/".join(map(str, case["votes"])),
                      str(case["trainer_buffer_admitted"]), (case["reasons"] or [""])[0][:60])
    console.print(table)
    lazy = report["collusion"]
    before = [w / ETH for w in lazy["lazy_stake_before_wei"]]
    after = [w / ETH for w in lazy["lazy_stake_after_wei"]]
    console.print(f"lazy validators: challenged {lazy['challenged']}, overturned {lazy['overturned']}, "
                  f"{lazy['lazy_voters_slashed']} voters slashed (stake {before} -> {after} ETH), cheat worker "
                  f"slashed {lazy['cheat_worker_slashed_wei'] / ETH:g} ETH")
    console.print(f"every vote exactly once: {report['every_vote_exactly_once']}; validator B killed after "
                  f"{killed_after} fetches, restarted: judged {restarted.judged}, attested {restarted.attested}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    console.print(f"wrote {args.json} in {report['seconds']:.0f} s")


if __name__ == "__main__":
    main()
