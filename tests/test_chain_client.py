"""ChainClient against a real anvil: concurrent nonces, decoded reverts, dead and wrong chains, events."""

from __future__ import annotations

import base64
import json
import threading
import time

import pytest
from conftest import ETH, client_for, freeze_in_background
from rollnet.node.chain.anvil import AnvilProcess, free_port, start_anvil
from rollnet.node.chain.client import ChainClient, fees_from_history
from rollnet.node.chain.registry import RegistryClient, Role
from rollnet.node.config import Deployment
from rollnet.node.errors import (
    ChainUnavailable,
    ConfigError,
    ContractRevert,
    RollnetError,
    TransactionTimeout,
    WrongChain,
)
from rollnet.node.keys import dev_account
from rollnet.node.p2p.identity import PeerIdentity


def test_concurrent_sends_from_one_sender_never_clash(anvil: AnvilProcess) -> None:
    sender = client_for(anvil, 0)
    recipients = [dev_account(i).address for i in range(10, 18)]
    before = {r: sender.balance(r) for r in recipients}
    receipts: list = []
    errors: list[BaseException] = []

    def send(to: str) -> None:
        try:
            for _ in range(4):
                receipts.append(sender.transfer(to, 1))
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(r,)) for r in recipients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(receipts) == 32
    nonces = {sender.w3.eth.get_transaction(r["transactionHash"])["nonce"] for r in receipts}
    assert len(nonces) == 32
    assert all(sender.balance(r) == before[r] + 4 for r in recipients)


def test_nonce_resyncs_after_an_external_send(anvil: AnvilProcess) -> None:
    first = client_for(anvil, 1)
    first.transfer(dev_account(2).address, 1)
    other = client_for(anvil, 1)  # a second process using the same key
    other.transfer(dev_account(2).address, 1)
    with pytest.raises(Exception):  # noqa: B017 - our stale counter is refused by the node...
        first.transfer(dev_account(2).address, 1)
    first.transfer(dev_account(2).address, 1)  # ...and the next send has resynchronised
    assert first.w3.eth.get_transaction_count(first.address) == 3


def test_custom_errors_decode_to_a_readable_line(market: Deployment, anvil: AnvilProcess) -> None:
    registry = RegistryClient(client_for(anvil, 1), market.registry)
    peer = PeerIdentity.generate()
    with pytest.raises(ContractRevert) as caught:
        registry.join(peer, Role.VALIDATOR, 2 * ETH)
    assert caught.value.error_name == "StakeBelowMinimum"
    assert str(caught.value) == "stake 2 ETH is below the minimum of 5 ETH for this role"
    assert caught.value.error_args == {"minimum": 5 * ETH, "provided": 2 * ETH}
    with pytest.raises(ContractRevert, match="InvalidRoles"):
        registry.join(peer, Role(0), 2 * ETH)


def test_dead_endpoint_is_a_clear_error_quickly() -> None:
    started = time.monotonic()
    with pytest.raises(ChainUnavailable, match="no Ethereum node answers"):
        ChainClient(f"http://127.0.0.1:{free_port()}")
    assert time.monotonic() - started < 5


def test_wrong_chain_id_is_refused() -> None:
    other = start_anvil(chain_id=4242)
    try:
        with pytest.raises(WrongChain, match="has id 4242, but the deployment is on chain 31337"):
            ChainClient(other.url, expected_chain_id=31337)
    finally:
        other.stop()


def test_follow_yields_events_in_chain_order_from_a_block(market: Deployment, anvil: AnvilProcess) -> None:
    peers = {index: PeerIdentity.generate() for index in (1, 2, 3)}
    for index, peer in peers.items():
        RegistryClient(client_for(anvil, index), market.registry).join(peer, Role.WORKER, ETH)
    reader = ChainClient(anvil.url)
    contract = reader.contract("NodeRegistry", market.registry)
    stop = threading.Event()
    seen = []
    for log in reader.follow(contract, ["NodeJoined", "FactorySet"], market.deployed_at_block, stop=stop):
        seen.append((log["event"], log["args"].get("peerId")))
        if len(seen) == 4:
            stop.set()
    assert seen == [("FactorySet", None), *[("NodeJoined", peers[i].peer_id_bytes) for i in (1, 2, 3)]]


def test_logs_come_in_bounded_ranges_with_one_request_each_whatever_the_event_kinds(
        market: Deployment, anvil: AnvilProcess) -> None:
    """A follower's requests grow with the blocks it covers (one eth_getLogs per range of at most max_blocks),
    not with the event kinds it follows or the events in them; the ranges tile start..end without a gap."""
    peers = {index: PeerIdentity.generate() for index in (1, 2, 3, 4, 5)}
    for index, peer in peers.items():
        RegistryClient(client_for(anvil, index), market.registry).join(peer, Role.WORKER, ETH)
    reader = ChainClient(anvil.url)
    contract = reader.contract("NodeRegistry", market.registry)
    head = reader.block_number()
    requests = []
    original = reader.w3.eth.get_logs
    reader.w3.eth.get_logs = lambda params: requests.append(params) or original(params)  # type: ignore[method-assign]
    kinds = ["NodeJoined", "FactorySet", "Slashed", "StakeAdded", "UnbondRequested"]
    ranges = list(reader.log_ranges(contract, kinds, market.deployed_at_block, head, max_blocks=3))
    span = head - market.deployed_at_block + 1
    assert len(requests) == len(ranges) == -(-span // 3)
    assert [(r["fromBlock"], r["toBlock"]) for r in requests] == [
        (low, min(head, low + 2)) for low in range(market.deployed_at_block, head + 1, 3)]
    assert [end for end, _ in ranges] == [r["toBlock"] for r in requests]
    logs = [log for _, chunk in ranges for log in chunk]
    assert [(log["event"], log["args"].get("peerId")) for log in logs] == [
        ("FactorySet", None), *[("NodeJoined", peers[i].peer_id_bytes) for i in (1, 2, 3, 4, 5)]]
    assert logs == sorted(logs, key=lambda log: (log["blockNumber"], log["logIndex"]))


def test_receipt_wait_times_out_with_a_clear_error(anvil: AnvilProcess) -> None:
    sender = ChainClient(anvil.url, dev_account(6), receipt_timeout=1.0)
    sender.rpc("evm_setAutomine", [False])
    with pytest.raises(TransactionTimeout, match=r"was sent but not mined within 1s"):
        sender.transfer(dev_account(7).address, 1)
    sender.rpc("evm_mine", [])
    assert sender.w3.eth.get_transaction_count(sender.address) == 1


def test_a_send_lost_on_the_way_is_sent_again_and_leaves_no_nonce_gap(anvil: AnvilProcess,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A send whose request times out may never have reached the node. Its nonce is spent locally, so if the node
    never saw it, every later transaction would queue behind the gap: the client sends the same bytes again."""
    import requests

    sender = ChainClient(anvil.url, dev_account(8), receipt_timeout=5.0)
    forward = sender.w3.eth.send_raw_transaction
    lost: list[bytes] = []

    def lose_the_first(raw: bytes) -> object:
        if not lost:
            lost.append(raw)
            raise requests.Timeout("the request never arrived")
        return forward(raw)

    monkeypatch.setattr(sender.w3.eth, "send_raw_transaction", lose_the_first)
    first = sender.transfer(dev_account(9).address, 1)
    second = sender.transfer(dev_account(9).address, 1)
    assert lost and first["status"] == 1 and second["status"] == 1
    nonces = [sender.w3.eth.get_transaction(r["transactionHash"])["nonce"] for r in (first, second)]
    assert nonces == [0, 1] and sender.w3.eth.get_transaction_count(sender.address) == 2


def test_fees_come_from_the_nodes_fee_history() -> None:
    """The median priority fee recent blocks paid (empty blocks do not count), else the node's suggestion; the cap
    leaves room for the next block's base fee to double."""
    assert fees_from_history([7, 8, 10], [0, 3, 5, 0, 4], None) == {"maxFeePerGas": 24, "maxPriorityFeePerGas": 4}
    assert fees_from_history([7, 8, 10], [0, 0], 2) == {"maxFeePerGas": 22, "maxPriorityFeePerGas": 2}


def test_transactions_mine_on_a_chain_with_real_block_times(tmp_path: object) -> None:
    """With a block every second (`anvil --block-time 1`, an L2's cadence scaled down), a transaction waits for
    its block, pays the fees the node's history asks, and the node's base fee is what it was priced against."""
    node = start_anvil(extra_args=["--block-time", "1"])
    try:
        sender = ChainClient(node.url, dev_account(0))
        started = sender.block_number()
        receipt = sender.transfer(dev_account(11).address, 1)
        assert receipt["status"] == 1 and receipt["blockNumber"] > started
        block = sender.w3.eth.get_block(receipt["blockNumber"])
        fees = sender._current_fees()
        assert receipt["effectiveGasPrice"] == block["baseFeePerGas"] + fees["maxPriorityFeePerGas"]
        assert fees["maxFeePerGas"] >= 2 * block["baseFeePerGas"]
        assert sender.fees_paid_wei == receipt["gasUsed"] * receipt["effectiveGasPrice"] > 0
    finally:
        node.stop()


def test_a_chain_set_up_at_once_then_mines_on_its_block_time() -> None:
    """`mine_every`: transactions sent before it are mined at once; after it, each waits for the next block of the
    interval, and no block comes per transaction. A bad interval or a chain that is gone is a clear error."""
    node = start_anvil()
    try:
        sender = ChainClient(node.url, dev_account(0))
        before = sender.block_number()
        assert sender.transfer(dev_account(11).address, 1)["blockNumber"] == before + 1  # mined at once
        node.mine_every(1)
        with pytest.raises(ConfigError, match="at least one second"):
            node.mine_every(0)
        sent = time.monotonic()
        receipts = [sender.transfer(dev_account(11).address, 1) for _ in range(2)]
        assert time.monotonic() - sent >= 1.0  # each waited for an interval's block
        blocks = [sender.w3.eth.get_block(r["blockNumber"]) for r in receipts]
        assert blocks[1]["timestamp"] - blocks[0]["timestamp"] >= 1
    finally:
        node.stop()
    with pytest.raises(ChainUnavailable, match="did not take the block interval"):
        node.mine_every(1)
    refusing = _ScriptedHTTP(body=json.dumps({"jsonrpc": "2.0", "id": 1,
                                              "error": {"code": -32601, "message": "Method not found"}}).encode())
    try:  # a node that is not anvil refuses for good: a plain error, not an outage to wait out
        with pytest.raises(RollnetError, match="refused a block interval .is it anvil..: .*Method not found") as no:
            AnvilProcess(pid=0, port=refusing.port, chain_id=1).mine_every(2)
        assert not isinstance(no.value, ChainUnavailable) and refusing.methods() == ["evm_setIntervalMining"]
    finally:
        refusing.close()


def test_a_read_after_our_own_transaction_rides_out_a_frozen_chain(anvil: AnvilProcess) -> None:
    """What a worker reads right after its claim (the lease it now holds) waits for a frozen endpoint to come back
    within the outage bound, and fails clearly past it: a mined claim is never dropped for a read."""
    client = ChainClient(anvil.url, dev_account(1), request_timeout=0.5, outage_seconds=30)
    before = client.block_number()
    thaw = freeze_in_background(anvil, 3.0)
    assert client.through_outage(client.block_number) == before  # answered once the chain came back
    thaw.join()
    impatient = ChainClient(anvil.url, request_timeout=0.5, outage_seconds=1)
    thaw = freeze_in_background(anvil, 4.0)
    try:
        with pytest.raises(ChainUnavailable, match="no Ethereum node answers"):
            impatient.through_outage(impatient.block_number)  # past its bound: a clear error
    finally:
        thaw.join()


def test_fast_reads_answer_exactly_as_web3_does_for_every_view_of_the_contracts(market: Deployment,
                                                                                anvil: AnvilProcess) -> None:
    """`ChainClient.call` reads without web3's per-call machinery (`node.chain.calls`). Every view function of
    the three contracts, on a job with a claimed lease and staked members, answers the same through it as
    through web3's own `call()` (value and type: tuples, checksummed addresses, bytes, lists), at the latest and
    the pending block; a revert still surfaces as the same named `ContractRevert`. Every function's calldata, as
    a transaction carries it, is web3's encoding byte for byte."""
    from conftest import REPO
    from rollnet.node.chain.calls import FALLBACK, call_data, fast_call
    from rollnet.node.chain.job import FactoryClient, JobClient
    from rollnet.node.spec import load_job_spec

    RegistryClient(client_for(anvil, 2), market.registry).join(PeerIdentity.generate(), Role.WORKER, 5 * ETH)
    RegistryClient(client_for(anvil, 3), market.registry).join(PeerIdentity.generate(), Role.VALIDATOR, 10 * ETH)
    requester = client_for(anvil, 1)
    spec = load_job_spec(REPO / "examples" / "job.toml")
    job_address = FactoryClient(requester, market.factory).create_job(spec.to_abi(requester.address), 5 * ETH)
    JobClient(requester, job_address).publish_policy(1, b"\x11" * 32)
    worker = JobClient(client_for(anvil, 2), job_address)
    worker.claim()
    reader = ChainClient(anvil.url)
    samples = {"uint": [0, 1], "address": [dev_account(2).address, dev_account(3).address], "bool": [True],
               "bytes32": [b"\x11" * 32], "uint8": [0, 1]}
    compared = encoded = 0
    for name, address in (("TrainingJob", job_address), ("NodeRegistry", market.registry),
                          ("JobFactory", market.factory)):
        contract = reader.contract(name, address)
        for abi in contract.abi:
            if abi.get("type") != "function":
                continue
            kinds = ["uint" if i["type"].startswith("uint") and i["type"] != "uint8" else i["type"]
                     for i in abi["inputs"]]
            if any(kind not in samples for kind in kinds):
                continue
            for index in range(2):
                args = [samples[kind][index % len(samples[kind])] for kind in kinds]
                fn = contract.get_function_by_signature(
                    f"{abi['name']}({','.join(i['type'] for i in abi['inputs'])})")(*args)
                assert "0x" + call_data(reader.w3, fn).hex() == fn._encode_transaction_data()  # what a sender signs
                encoded += 1
                if abi.get("stateMutability") not in ("view", "pure"):
                    continue
                for block in ("latest", "pending"):
                    try:
                        expected: object = fn.call(block_identifier=block)
                    except Exception as exc:  # noqa: BLE001 - a revert must stay a revert
                        expected = type(exc)
                    fast = fast_call(reader.w3, fn, block)
                    if expected is not None and isinstance(expected, type):
                        assert fast is FALLBACK, (abi["name"], args)
                        continue
                    assert fast == expected and type(fast) is type(expected), (abi["name"], args, fast, expected)
                    compared += 1
    assert compared >= 60 and encoded > compared // 2
    with pytest.raises(ContractRevert) as refused:  # a read of a call that reverts (only the trainer publishes)
        reader.call(reader.contract("TrainingJob", job_address).functions.publishPolicy(2, b"\x22" * 32))
    assert refused.value.error_name == "NotTrainer"


class _ScriptedHTTP:
    """A real loopback HTTP server that answers JSON-RPC requests with `0x7a69` (or `body`, with HTTP `status`), and
    on each connection, by `mode`: `"idle-close"` answers the first request and closes (as a node's idle keep-alive
    timeout does); `"drop-second"` answers the first, then reads the second and closes unanswered (a node that took
    a request and died); `"silent"` closes every connection unread. It records each request's method and
    headers."""

    def __init__(self, mode: str = "idle-close", status: int = 200, body: bytes | None = None):
        import socket
        self.mode, self.status, self.body = mode, status, body
        self.connections = 0
        self.received: list[tuple[str, dict[str, str]]] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            with connection:
                if self.mode == "silent":
                    continue
                buffered = b""
                for served in range(2 if self.mode == "drop-second" else 1):
                    request_id, buffered = self._read_request(connection, buffered)
                    if served == 1:
                        break  # taken, never answered
                    payload = self.body or json.dumps({"jsonrpc": "2.0", "id": request_id, "result": "0x7a69"}).encode()
                    connection.sendall(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                                       % (self.status, len(payload)) + payload)

    def _read_request(self, connection: object, buffered: bytes) -> tuple[object, bytes]:
        request = buffered
        while b"\r\n\r\n" not in request:
            request += connection.recv(65536)  # type: ignore[attr-defined]
        head, _, body = request.partition(b"\r\n\r\n")
        headers = dict(line.decode().split(": ", 1) for line in head.split(b"\r\n")[1:])
        length = int(headers["Content-Length"])
        while len(body) < length:
            body += connection.recv(65536)  # type: ignore[attr-defined]
        message = json.loads(body[:length])
        self.received.append((message["method"], headers))
        return message["id"], body[length:]

    def methods(self) -> list[str]:
        return [method for method, _ in self.received]

    def close(self) -> None:
        self.server.close()


def test_the_kept_alive_transport_resends_only_reads_and_only_over_a_connection_the_server_dropped(
        anvil: AnvilProcess) -> None:
    """Requests share one kept-alive connection per thread (a real anvil answers 200 reads over a handful of
    connections, one per thread, each answer right). A connection the server closed while idle is replaced before
    a request goes out on it. A read whose reused connection is dropped under it goes once more on a fresh one; a
    transaction never goes twice (the node may have taken it): its failure is `ChainUnavailable`, and the server saw
    it once. A fresh connection's failure is never retried."""
    client = ChainClient(anvil.url, request_timeout=5)
    transport = client.w3.provider.transport
    answers: list[int] = []

    def read(index: int) -> None:
        for _ in range(25):
            answers.append(client.balance(dev_account(index).address))

    threads = [threading.Thread(target=read, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answers) == 200 and all(balance > 0 for balance in answers)
    assert client.requests["eth_getBalance"] == 200
    assert transport is client.w3.provider.transport

    idle_closing = _ScriptedHTTP("idle-close")
    try:
        flaky = ChainClient(idle_closing.url, request_timeout=5)  # asks eth_chainId: 0x7a69 is anvil's 31337
        assert flaky.chain_id == 31337
        for _ in range(4):
            time.sleep(0.05)  # the server's close reaches us while the connection is idle
            assert flaky.rpc("eth_blockNumber", []) == "0x7a69"
        # every request went out once, each on a fresh connection: the closed one was never written to
        assert idle_closing.methods().count("eth_blockNumber") == 4
        assert idle_closing.connections == len(idle_closing.received)
    finally:
        idle_closing.close()

    dropping = _ScriptedHTTP("drop-second")
    try:
        node = ChainClient(dropping.url, request_timeout=5)
        assert node.rpc("eth_blockNumber", []) == "0x7a69"  # dropped under it on the reused connection: re-sent
        assert dropping.methods()[-2:] == ["eth_blockNumber", "eth_blockNumber"]
        assert node.rpc("eth_blockNumber", []) == "0x7a69"  # the same again: the third connection has answered once
        with pytest.raises(ChainUnavailable, match="no Ethereum node answers"):
            node.rpc("eth_sendRawTransaction", ["0x00"])  # taken, then dropped: never sent a second time
        assert dropping.methods().count("eth_sendRawTransaction") == 1
    finally:
        dropping.close()

    silent = _ScriptedHTTP("silent")
    try:
        with pytest.raises(ChainUnavailable, match="no Ethereum node answers"):
            ChainClient(silent.url, request_timeout=5)
        assert silent.connections == 1
    finally:
        silent.close()


def test_the_transport_tells_an_outage_from_a_mistake_and_bounds_what_it_reads() -> None:
    """5xx, 408 and 429 mean the node is away or overloaded (`ChainUnavailable`, ridden out); another status is
    a clear mistake at once (a JSON-RPC error body says what the node refused); credentials in the URL become
    Basic auth and never reach the Host header or a message; an answer over the client's bound is refused."""
    for status in (502, 503, 429):
        refusing = _ScriptedHTTP(status=status)
        try:
            with pytest.raises(ChainUnavailable, match=f"HTTP {status}"):
                ChainClient(refusing.url, request_timeout=5)
        finally:
            refusing.close()
    locked = _ScriptedHTTP(status=401, body=b"unauthorized")
    try:
        with pytest.raises(RollnetError, match="HTTP 401 X: check its URL and credentials") as refused:
            ChainClient(locked.url.replace("http://", "http://alice:s%3Acret@"), request_timeout=5)
        assert not isinstance(refused.value, ChainUnavailable) and "s%3Acret" not in str(refused.value)
        ((_, headers),) = locked.received
        assert headers["Host"] == f"127.0.0.1:{locked.port}"
        assert headers["Authorization"] == "Basic " + base64.b64encode(b"alice:s:cret").decode()
    finally:
        locked.close()
    rpc_error = json.dumps({"jsonrpc": "2.0", "id": 0, "error": {"code": -32600, "message": "bad request"}})
    invalid = _ScriptedHTTP(status=400, body=rpc_error.encode())
    try:
        with pytest.raises(RollnetError, match="the chain refused the request: bad request"):
            ChainClient(invalid.url, request_timeout=5)
    finally:
        invalid.close()
    chatty = _ScriptedHTTP()
    try:
        client = ChainClient(chatty.url, request_timeout=5)
        client.w3.provider.transport.max_response_bytes = 32
        with pytest.raises(RollnetError, match="over the 32 bytes this client reads"):
            client.rpc("eth_blockNumber", [])
    finally:
        chatty.close()
    with pytest.raises(RollnetError, match="http:// or https://"):
        ChainClient("ws://127.0.0.1:1", request_timeout=5)
