"""Models come from peers: a participant that joins late, with an empty model cache and an empty policy store,
fetches the newest anchor checkpoint (safetensors, config, tokenizer) over libp2p, checks it against the
chain's roots, follows the signed deltas after it, and never needs version 0 on disk. Peers that lie about
an anchor (wrong tensors under a claimed version, absurd sizes) are refused, counted as faults, and cost the
joiner no large download. Everything is real: an Anvil chain, libp2p hosts on 127.0.0.1, torch models.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import ETH, REPO, client_for
from rollnet.node.chain.anvil import AnvilProcess
from rollnet.node.chain.job import FactoryClient, JobClient, LeaseStatus, Outcome
from rollnet.node.chain.registry import RegistryClient, Role
from rollnet.node.config import Deployment
from rollnet.node.delta.checkpoint import content_root, save_checkpoint, tensor_hash
from rollnet.node.delta.store import PolicyStore
from rollnet.node.model.identity import folder_model_files_hash
from rollnet.node.model.loading import load_policy
from rollnet.node.model.peer_source import AnchorsRefused, NoAnchor, job_model
from rollnet.node.model.pinned import EMBEDDED_TASK
from rollnet.node.model.policies import bf16_policy
from rollnet.node.model.tokenizer import build_char_tokenizer
from rollnet.node.p2p.anchors import CHECKPOINT, BundleFile, model_files
from rollnet.node.p2p.envelopes import PolicyAnnouncement, seal
from rollnet.node.p2p.host import P2PNode, topics
from rollnet.node.p2p.identity import load_or_create_identity
from rollnet.node.p2p.objects import ObjectStore, object_root
from rollnet.node.participant import register_trainer, serve_anchors, start_participant
from rollnet.node.policy_sync import PolicyFollower
from rollnet.node.spec import load_job_spec
from rollnet.node.tasks import load_task
from transformers import Qwen2Config, Qwen2ForCausalLM

from rollnet.cli import main

ANCHOR_EVERY = 2
VERSIONS = 5  # the chain's version when the late participants join: >= 2 x ANCHOR_EVERY, one delta past an anchor
LISTEN = "/ip4/127.0.0.1/tcp/0"


def tiny_model(folder: Path, seed: int) -> Path:
    """A small Qwen2 with a character tokenizer covering the job's task, saved as a model folder."""
    task = load_task(EMBEDDED_TASK)
    alphabet = sorted({char for instance in task.examples(range(500)) for char in instance.prompt + instance.answer})
    tokenizer = build_char_tokenizer("".join(alphabet))
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         tie_word_embeddings=True, bos_token_id=tokenizer.eos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


class Trainer:
    """The job's trainer as far as followers see it: a policy store anchoring every ANCHOR_EVERY versions,
    each version published on chain and announced (signed) with its delta; its host serves both."""

    def __init__(self, anvil: AnvilProcess, market: Deployment, model_folder: Path, folder: Path):
        self.client = client_for(anvil, 0)
        self.model, self.tokenizer = load_policy(model_folder)
        self.store = PolicyStore(folder / "policies", trainer=self.client.address, anchor_every=ANCHOR_EVERY)
        self.previous = bf16_policy(self.model)
        self.store.publish(0, self.previous, self.client.account)
        spec = load_job_spec(REPO / "examples" / "job.toml").model_copy(update={
            "group_size": 2, "tasks_per_lease": 2, "model_root": "0x" + self.store.roots[0].hex(),
            "model_files_hash": "0x" + folder_model_files_hash(model_folder).hex()})
        self.job = JobClient(self.client, FactoryClient(self.client, market.factory).create_job(
            spec.to_abi(self.client.address), 2 * ETH))
        self.registry = RegistryClient(self.client, market.registry)
        self.folder = folder
        self.node: P2PNode | None = None
        self.announcements: dict[int, bytes] = {}
        self.generator = torch.Generator().manual_seed(1)

    def publish(self, version: int) -> None:
        """One update of the weights (about 5% of the elements move), published like the market trainer does."""
        with torch.no_grad():
            for parameter in self.model.parameters():
                moved = torch.rand(parameter.shape, generator=self.generator) < 0.05
                parameter.add_(0.05 * torch.randn(parameter.shape, generator=self.generator) * moved)
        tensors = bf16_policy(self.model)
        published = self.store.publish(version, tensors, self.client.account, previous=self.previous)
        self.previous = tensors
        self.job.publish_policy(version, published.root)
        data = self.store.delta_path(version).read_bytes()
        objects = ObjectStore(self.folder / "objects")
        body = PolicyAnnouncement(job=self.job.address, nonce=version, timestamp=time.time(), version=version,
                                  base_version=self.store.deltas[version], target_root=published.root.hex(),
                                  delta_root=objects.put(data).hex(), delta_size=len(data))
        self.announcements[version] = seal(body, self.client.account)

    def start(self) -> str:
        """Start the trainer's host (registered, gated, serving its anchors and announcements)."""
        register_trainer(self.registry, load_or_create_identity(self.folder))
        participant = start_participant(self.registry, self.job, self.folder, self.folder / "objects", listen=LISTEN)
        self.node = participant.node
        serve_anchors(self.node, self.job.address, self.store, self.model, self.tokenizer)
        self.node.policy_source = lambda start: [self.announcements[v] for v in sorted(self.announcements)
                                                 if v >= start]
        for version in sorted(self.announcements):
            self.node.publish(topics(self.job.address)["policy"], self.announcements[version])
        return participant.address

    def stop(self) -> None:
        if self.node is not None:
            self.node.stop()


@pytest.fixture
def trainer(anvil: AnvilProcess, market: Deployment, tmp_path: Path):  # noqa: ANN201
    """A job whose trainer has published VERSIONS versions (anchors at 2 and 4 kept, 0 pruned) on chain."""
    trainer = Trainer(anvil, market, tiny_model(tmp_path / "trainer-model", seed=0), tmp_path / "trainer")
    for version in range(1, VERSIONS + 1):
        trainer.publish(version)
    assert trainer.store.anchors == [2, 4] and trainer.job.current_version() == VERSIONS
    yield trainer
    trainer.stop()


def test_a_worker_joining_late_with_an_empty_cache_gets_the_model_from_peers_and_its_lease_is_accepted(
        trainer: Trainer, market: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture) -> None:
    """`node work` on an empty data directory, at version 5 with anchors every 2 versions: the worker fetches
    anchor 4 from the trainer, verifies it against policyRoot[4], applies delta 5, and generates at version 5;
    two validators, also starting empty, get the model the same way and accept its batch on chain."""
    monkeypatch.setenv("ROLLNET_DEPLOYMENT", str(tmp_path / "deployment.json"))
    market.save(tmp_path)
    trainer.start()
    worker = tmp_path / "worker"
    assert main(["--data-dir", str(worker), "node", "join", "--stake", "10", "--dev-account", "1"]) == 0
    for index in (2, 3):
        assert main(["--data-dir", str(tmp_path / f"validator-{index}"), "node", "join", "--stake", "6", "--role",
                     "validator", "--dev-account", str(index)]) == 0
    capsys.readouterr()
    job = trainer.job
    codes: list[int] = []
    working = threading.Thread(target=lambda: codes.append(main(
        ["--data-dir", str(worker), "node", "work", "--job", job.address, "--leases", "1", "--serve", "20",
         "--dev-account", "1"])))
    working.start()
    deadline = time.monotonic() + 120
    while not job.client.events(job.contract, "BatchSubmitted", 0) and time.monotonic() < deadline:
        assert working.is_alive() or not codes, capsys.readouterr()
        time.sleep(0.3)
    (submitted,) = job.client.events(job.contract, "BatchSubmitted", 0)
    assert submitted["args"]["policyVersion"] == VERSIONS
    for index in (2, 3):
        assert main(["--data-dir", str(tmp_path / f"validator-{index}"), "validator", "run", "--once", "--job",
                     job.address, "--dev-account", str(index)]) == 0
    lease = job.lease(submitted["args"]["leaseId"])
    assert lease.status is LeaseStatus.DECIDED and lease.outcome is Outcome.ACCEPT
    working.join(timeout=60)
    assert codes == [0]
    out = capsys.readouterr().out
    assert out.count("anchor version 4") == 3, out  # the worker and both validators started from anchor 4
    for name in ("worker", "validator-2", "validator-3"):
        store = PolicyStore(tmp_path / name / "policies", trainer=trainer.client.address)
        assert store.anchors == [4] and 0 not in store.roots  # never version 0
        assert store.roots[VERSIONS] == job.policy_root(VERSIONS)
        assert store.roots[4] == job.policy_root(4)
        (folder,) = (tmp_path / name / "models").iterdir()  # only the folder built from the fetched anchor
        assert folder.name == f"anchor-{job.policy_root(4).hex()[:16]}"
        assert json.loads((folder / "rollnet-anchor.json").read_text())["version"] == 4
    events = [json.loads(line) for line in (worker / "events.jsonl").read_text().splitlines()]
    assert [e["version"] for e in events if e["kind"] == "policy"] == [VERSIONS]  # one delta after the anchor


def liar(anvil: AnvilProcess, market: Deployment, folder: Path, index: int,
         answer: Callable[[dict], dict]) -> P2PNode:
    """A staked peer (registered, listening, dialled by joiners) that answers anchor requests with `answer`."""
    node = P2PNode(load_or_create_identity(folder), ObjectStore(folder / "objects"), gate=None).start()
    registry = RegistryClient(client_for(anvil, index), market.registry)
    registry.join(node.identity, Role.WORKER, 2 * ETH)
    registry.set_listen_addrs([node.addr.split("/p2p/")[0]])
    node.anchor_source = answer
    return node


def test_lying_peers_are_refused_without_large_downloads_and_an_honest_peer_still_serves_the_model(
        trainer: Trainer, anvil: AnvilProcess, market: Deployment, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """A joiner whose local model is not the job's asks its peers. With none, and then with only liars, it
    fails with one line; the liars (tensors that are not the chain's under a claimed version, a hash list
    that does not make the chain's root, sizes the architecture cannot have, a checkpoint object larger than
    declared, a malformed answer) each get a fault, and nothing large is downloaded. Once the trainer is up,
    the joiner adopts its anchor and follows the deltas to the chain's version."""
    job = trainer.job
    honest5 = trainer.store.materialize(VERSIONS)
    hashes5 = {name: tensor_hash(name, tensor).hex() for name, tensor in honest5.items()}
    honest_file = tmp_path / "honest5.safetensors"
    save_checkpoint(honest_file, honest5, metadata={"version": str(VERSIONS)})
    tampered = dict(honest5)
    tampered["model.norm.weight"] = tampered["model.norm.weight"] + 1
    tampered_file = tmp_path / "tampered5.safetensors"
    save_checkpoint(tampered_file, tampered, metadata={"version": str(VERSIONS)})
    files = model_files(trainer.model, trainer.tokenizer)
    assert "generation_config.json" in files  # the EOS set travels with the tokenizer
    entries = [BundleFile(name=name, root=object_root(data).hex(), size=len(data)).model_dump()
               for name, data in files.items()]
    # Honest weights with a tokenizer that maps text differently (lower-cases it first): loads, and is sane.
    definition = json.loads(files["tokenizer.json"])
    definition["normalizer"] = {"type": "Lowercase"}
    lying_files = {**files, "tokenizer.json": json.dumps(definition).encode()}
    lying_entries = [BundleFile(name=name, root=object_root(data).hex(), size=len(data)).model_dump()
                     for name, data in lying_files.items()]
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x5a" * (3 * honest_file.stat().st_size))

    def bundle(tensors: dict[str, str], root: str, size: int, files: list[dict] = entries) -> dict:
        return {"bundle": {"job": job.address, "version": VERSIONS, "tensors": tensors, "files": files,
                           "checkpoint": {"name": CHECKPOINT, "root": root, "size": size}}}

    # The joiner: staked, registered, its own model not the job's, no peers yet.
    joiner_dir = tmp_path / "joiner"
    client = client_for(anvil, 1)
    registry = RegistryClient(client, market.registry)
    registry.join(load_or_create_identity(joiner_dir), Role.WORKER, 2 * ETH)
    node = start_participant(registry, JobClient(client, job.address), joiner_dir, joiner_dir / "objects",
                             listen=LISTEN).node
    liars: dict[str, P2PNode] = {}
    try:
        follower = PolicyFollower(node, PolicyStore(joiner_dir / "policies", trainer=trainer.client.address),
                                  JobClient(client, job.address), registry)
        wrong = tiny_model(tmp_path / "wrong-model", seed=7)
        with pytest.raises(NoAnchor) as none:
            job_model(follower, joiner_dir, wrong, EMBEDDED_TASK)
        assert re.fullmatch(r"no peer offers an anchor of job 0x\w+ at or below version 5 \(asked 0 connected "
                            r"peer\(s\)\); the local model \S+wrong-model is not the job's base model \(content "
                            r"root \w+…, the job's \w+…\)", str(none.value)), none.value
        assert "fetching the model from peers instead" in caplog.text  # the local model's root was not the job's
        # The job's weights with another EOS set: even a validator's lenient fallback refuses to judge with it.
        retokenized = tmp_path / "retokenized"
        shutil.copytree(tmp_path / "trainer-model", retokenized)
        (retokenized / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 3]}))
        with pytest.raises(NoAnchor) as lenient:
            job_model(follower, joiner_dir, retokenized, EMBEDDED_TASK, strict=False)
        assert str(lenient.value).endswith("(same weights, but another tokenizer, chat template, EOS set or "
                                           "architecture setting))"), lenient.value

        roots = {"tampered": None, "oversized": object_root(junk.read_bytes())}
        kinds = {
            "tampered": lambda store: bundle(hashes5, store.put_file(tampered_file).hex(),
                                             tampered_file.stat().st_size),
            "root-lie": lambda store: bundle({n: tensor_hash(n, t).hex() for n, t in tampered.items()},
                                             store.put_file(tampered_file).hex(), tampered_file.stat().st_size),
            "absurd-size": lambda store: bundle(hashes5, store.put_file(junk).hex(), 50 * 10**9),
            "oversized": lambda store: bundle(hashes5, store.put_file(junk).hex(), honest_file.stat().st_size),
            "malformed": lambda store: bundle(hashes5, "00" * 32, 10**12),  # over any checkpoint's bound
            "tokenizer-lie": lambda store: bundle(hashes5, store.put_file(honest_file).hex(),
                                                  honest_file.stat().st_size, lying_entries),
        }
        for index, (kind, make) in enumerate(kinds.items(), start=4):
            store = ObjectStore(tmp_path / kind / "objects")
            for data in (lying_files if kind == "tokenizer-lie" else files).values():
                store.put(data)
            answer = make(store)
            if kind == "tampered":
                roots["tampered"] = bytes.fromhex(answer["bundle"]["checkpoint"]["root"])
            liars[kind] = liar(anvil, market, tmp_path / kind, index, lambda request, answer=answer: answer)
        assert len(node.connect([f"{n.addr}" for n in liars.values()])) == len(liars)
        with pytest.raises(AnchorsRefused) as refused:
            job_model(follower, joiner_dir, wrong, EMBEDDED_TASK)
        message = str(refused.value)
        assert "\n" not in message and message.startswith("every anchor peers offered failed verification")
        assert message.endswith("is not the job's base model (content root "
                                f"{content_root(bf16_policy(load_policy(wrong)[0])).hex()[:16]}…, the job's "
                                f"{job.policy_root(0).hex()[:16]}…)")
        assert message.count("version 5 from") == 5, message  # the malformed answer was no offer
        assert "does not hash to the chain's root" in message  # the tampered checkpoint, after its download
        assert "tensor hashes do not make the chain's root" in message  # the root lie, before any download
        assert "the config's architecture needs" in message  # 50 GB for a model of a few hundred kB
        assert "its object has" in message  # the larger object: refused at its manifest
        assert "its config and tokenizer are not the job's (model_files_hash" in message  # before the checkpoint
        assert node.store.manifest(object_root(honest_file.read_bytes())) is None
        for kind, peer in liars.items():
            assert node.discipline.fault_count(peer.peer_id) >= 1, kind
        assert node.store.manifest(roots["tampered"]) is None  # downloaded, refused, deleted
        assert node.store.manifest(roots["oversized"]) is None and not node.store.have(roots["oversized"])
        assert follower.store.roots == {}

        node.connect([trainer.start()])
        obtained = job_model(follower, joiner_dir, wrong, EMBEDDED_TASK)
        assert obtained.source.startswith("anchor version 4") and obtained.folder.name.startswith("anchor-")
        assert follower.store.anchors == [4] and 0 not in follower.store.roots
        assert content_root(bf16_policy(obtained.model)) == job.policy_root(4)
        assert follower.wait_for(VERSIONS, timeout=30)
        assert content_root(follower.store.materialize(VERSIONS)) == job.policy_root(VERSIONS)
        # It serves what it adopted: a second joiner could start from it.
        answer = node.anchor_source({"job": job.address, "at_most": VERSIONS})
        assert answer["bundle"]["version"] == 4
    finally:
        for peer in liars.values():
            peer.stop()
        node.stop()

