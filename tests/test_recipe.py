"""The recipe is the chain's: a spec's generation, task and GRPO settings go on chain whole, every role reads
them from there, and a flag or a local task that contradicts them is refused in one line. Real anvil, real
task registry, the real embedded model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import ETH, REPO, client_for
from rollnet.node.chain.anvil import AnvilProcess
from rollnet.node.chain.job import FactoryClient, JobClient
from rollnet.node.chain.registry import RegistryClient, Role
from rollnet.node.config import Deployment
from rollnet.node.errors import ConfigError
from rollnet.node.model.pinned import EMBEDDED_FILES_HASH, EMBEDDED_ROOT
from rollnet.node.p2p.identity import PeerIdentity
from rollnet.node.recipe import agree, recipe_task
from rollnet.node.spec import load_job_spec
from rollnet.node.tasks import load_task, task_config_hash

from rollnet.cli import main


def _deploy(market: Deployment, anvil: AnvilProcess, **changes: object) -> JobClient:
    requester = client_for(anvil, 0)
    spec = load_job_spec(REPO / "examples" / "job.toml").model_copy(update=changes)
    address = FactoryClient(requester, market.factory).create_job(spec.to_abi(requester.address), 5 * ETH)
    return JobClient(requester, address)


def test_the_whole_recipe_is_on_chain(market: Deployment, anvil: AnvilProcess, tmp_path: Path) -> None:
    tasks = tmp_path / "sums.jsonl"
    tasks.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    from decimal import Decimal

    job = _deploy(market, anvil, model="my-model", model_root="0x" + "ab" * 32, model_files_hash="0x" + "cd" * 32,
                  task=str(tasks), max_new_tokens=12,
                  temperature=Decimal("0.7"), chat_template=True, stop_on_eos=False, clip_epsilon=Decimal("0.25"),
                  clip_delta=Decimal("3.5"), group_size=4, max_staleness=2)
    recipe = job.spec().recipe
    assert recipe.model_name == "my-model" and recipe.model_root == "0x" + "ab" * 32
    assert recipe.model_files_hash == "0x" + "cd" * 32
    assert recipe.task_name == str(tasks)
    assert recipe.task_config_hash == "0x" + task_config_hash(load_task(str(tasks))).hex()
    assert (recipe.max_new_tokens, recipe.temperature, recipe.chat_template, recipe.stop_on_eos) == (12, 0.7, True,
                                                                                                      False)
    assert (recipe.clip_epsilon, recipe.clip_delta, recipe.group_size, recipe.max_staleness) == (0.25, 3.5, 4, 2)
    assert job.policy_root(0).hex() == "ab" * 32


def test_the_embedded_model_is_pinned_by_its_real_root(market: Deployment, anvil: AnvilProcess) -> None:
    """A spec naming the embedded model pins the weights rollnet builds, not a name."""
    job = _deploy(market, anvil)
    assert job.policy_root(0).hex() == EMBEDDED_ROOT
    assert job.spec().model_files_hash.hex() == EMBEDDED_FILES_HASH
    assert job.spec().recipe.model_name == "embedded"


def test_a_task_that_differs_from_the_chains_is_refused(market: Deployment, anvil: AnvilProcess,
                                                        tmp_path: Path) -> None:
    """A worker whose task file (or registry) differs from the requester's would generate prompts no validator
    checks the same way: it is refused before any work."""
    tasks = tmp_path / "sums.jsonl"
    tasks.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    job = _deploy(market, anvil, task=str(tasks), model_root="0x" + "ab" * 32, model_files_hash="0x" + "cd" * 32)
    recipe = job.spec().recipe
    assert recipe_task(recipe).instance(0).prompt == "1+1="
    tasks.write_text(json.dumps({"prompt": "1+1=", "answer": "3"}) + "\n")  # the answer key changed
    with pytest.raises(ConfigError, match="configuration .* but the job pins"):
        recipe_task(recipe)
    with pytest.raises(ConfigError, match=r"--task addition-2digit contradicts the job's recipe"):
        recipe_task(recipe, task_flag="addition-2digit")
    assert agree("--temperature", None, 0.7) == 0.7 and agree("--temperature", 0.7, 0.7) == 0.7


def test_a_chat_template_recipe_needs_a_template(model_home: Path) -> None:
    from rollnet.node.model.loading import load_policy
    from rollnet.node.tasks.templated import ChatTemplatedTask
    from rollnet.trainer.cli import local_task

    (folder,) = (model_home / "models").glob("addition-2digit-*")
    _, tokenizer = load_policy(folder)
    with pytest.raises(ConfigError, match="tokenizer has none"):
        ChatTemplatedTask(load_task("addition-2digit"), tokenizer)
    assert not isinstance(local_task("addition-2digit", tokenizer, None), ChatTemplatedTask)  # no template: raw
    with pytest.raises(ConfigError, match="--chat-template"):
        local_task("addition-2digit", tokenizer, True)
    tokenizer.chat_template = ("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
                               "{% if add_generation_prompt %}[assistant]{% endif %}")
    templated = ChatTemplatedTask(load_task("addition-2digit"), tokenizer)
    plain = load_task("addition-2digit").instance(5)
    assert isinstance(local_task("addition-2digit", tokenizer, None), ChatTemplatedTask)  # a local run's default
    assert not isinstance(local_task("addition-2digit", tokenizer, False), ChatTemplatedTask)  # --raw-prompts
    assert templated.instance(5).prompt == f"[user]{plain.prompt}[assistant]"
    assert templated.instance(5).answer == plain.answer
    assert templated.reward(templated.instance(5), plain.answer) == 1.0
    assert task_config_hash(templated) == task_config_hash(load_task("addition-2digit"))


@pytest.fixture
def chain_up(data_dir: Path):  # noqa: ANN201
    assert main(["chain", "up"]) == 0
    yield Deployment.load(data_dir)
    main(["chain", "down"])


def _one_line_error(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_flags_that_contradict_the_chain_are_refused(chain_up: Deployment, data_dir: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLNET_DEPLOYMENT", str(data_dir / "deployment.json"))
    assert main(["job", "deploy", "--spec", str(REPO / "examples" / "job.toml"), "--budget", "1",
                 "--dev-account", "0"]) == 0
    status = capsys.readouterr().out
    assert main(["job", "status", "latest"]) == 0
    status = capsys.readouterr().out
    assert "recipe" in status and "addition-2digit" in status and "up to 6 new tokens at temperature 1" in status
    assert "stop at EOS" in status and "ε 0.2, δ 4" in status and EMBEDDED_ROOT[:16] in status
    worker = ["--data-dir", str(tmp_path / "worker")]
    assert main([*worker, "node", "join", "--stake", "10", "--dev-account", "1"]) == 0
    err = _one_line_error(capsys, [*worker, "node", "work", "--task", "gym:basic_arithmetic", "--dev-account", "1"])
    assert re.search(r"--task gym:basic_arithmetic contradicts the job's recipe on chain \(addition-2digit\)", err)
    validator = ["--data-dir", str(tmp_path / "validator")]
    err = _one_line_error(capsys, [*validator, "validator", "run", "--once", "--stake", "6", "--task",
                                   "gym:basic_arithmetic", "--dev-account", "2"])
    assert "contradicts the job's recipe" in err
    trainer = ["--data-dir", str(tmp_path / "trainer"), "trainer", "run", "--job", "latest", "--dev-account", "0"]
    for flag, value in (("--epsilon", "0.3"), ("--delta", "2"), ("--group-size", "4"), ("--max-staleness", "1"),
                        ("--max-new-tokens", "128"), ("--temperature", "0.7")):
        err = _one_line_error(capsys, [*trainer, flag, value])
        assert f"{flag} " in err and "contradicts the job's recipe on chain" in err, err
    err = _one_line_error(capsys, [*trainer, "--chat-template"])  # the recipe has raw prompts
    assert "--chat-template True contradicts the job's recipe on chain (False)" in err, err


def test_the_worker_generates_as_the_chain_says(market: Deployment, anvil: AnvilProcess, model_home: Path,
                                                tmp_path: Path) -> None:
    """Length, temperature and EOS handling come from the chain: a recipe of 3 tokens without EOS stops gives
    exactly 3 tokens per completion, whatever the worker's code defaults are."""
    from rollnet.node.delta.checkpoint import content_root
    from rollnet.node.model.loading import load_policy
    from rollnet.node.model.policies import bf16_policy
    from rollnet.node.p2p.objects import ObjectStore
    from rollnet.node.rollout.backend import TransformersBackend
    from rollnet.node.worker import claim_with_seed, work_lease

    (folder,) = (model_home / "models").glob("addition-2digit-*")
    base, tokenizer = load_policy(folder)
    RegistryClient(client_for(anvil, 1), market.registry).join(PeerIdentity.generate(), Role.WORKER, 10 * ETH)
    requester = _deploy(market, anvil, max_new_tokens=3, stop_on_eos=False, group_size=2, tasks_per_lease=2)
    requester.publish_policy(1, content_root(bf16_policy(base)))
    worker = JobClient(client_for(anvil, 1), requester.address)
    lease = claim_with_seed(worker)
    recipe = worker.spec().recipe
    done = work_lease(worker, lease, worker.client.account, recipe_task(recipe, tokenizer),
                      TransformersBackend(base, tokenizer), ObjectStore(tmp_path / "objects"), policy_version=1,
                      policy_root=worker.policy_root(1).hex())
    assert len(done.rollouts) == 4
    assert all(len(rollout.tokens) == 3 for rollout in done.rollouts)
