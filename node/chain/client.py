"""A web3 client for one sender: contract handles, deployment, transactions, events.

Invariants:
- One `ChainClient` per key; its `NonceManager` hands out each nonce exactly once, so many threads may
  send concurrently without clashes; a failed send resynchronises from the chain.
- Every revert is decoded before sending (gas estimation replays the call), so a refused call costs no
  gas and surfaces as a `ContractRevert` naming the custom error.
- A dead endpoint raises `ChainUnavailable` within `request_timeout`; a wrong chain id raises `WrongChain`.
- A transaction is signed once; if the endpoint stops answering while it is sent or mined, the *same*
  signed bytes (same nonce, same hash) are re-sent until `outage_seconds` pass, so an outage can delay a
  transaction but never lose it or execute it twice. What a caller reads right after its own transaction
  (`through_outage`) rides out the same outage, so a mined transaction's result is never dropped for a read.
- An outage before a transaction is signed (its estimate, its fees) is `TransactionNotSent`: nothing was
  spent or sent, so a caller may build and send it afresh.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import requests
from eth_account.signers.local import LocalAccount
from rollnet.node.chain.artifacts import load_artifact
from rollnet.node.chain.calls import FALLBACK, fast_call, fast_estimate
from rollnet.node.chain.logs import EventDecoder
from rollnet.node.chain.revert import decode_revert
from rollnet.node.chain.transport import KeepAliveTransport, shown_url
from rollnet.node.errors import ChainUnavailable, RollnetError, TransactionNotSent, TransactionTimeout, WrongChain
from web3 import Web3
from web3.contract import Contract
from web3.contract.contract import ContractConstructor, ContractFunction
from web3.exceptions import ContractLogicError, TimeExhausted, TransactionNotFound, Web3RPCError
from web3.types import TxReceipt

TIMEOUT_ENV = "ROLLNET_RPC_TIMEOUT"
GAS_MARGIN = 1.25
FEE_CACHE_SECONDS = 5.0
FEE_HISTORY_BLOCKS = 10  # recent blocks whose priority fees set ours (eth_feeHistory)
FEE_PERCENTILE = 50
LOG_RANGE_BLOCKS = 2_000  # blocks per eth_getLogs request (public endpoints refuse much larger ranges)
log = logging.getLogger(__name__)


class CountingHTTPProvider(Web3.HTTPProvider):
    """An HTTP provider that counts the JSON-RPC requests it sends, by method (`requests`), so a participant's
    load on its endpoint is measured rather than guessed; it answers eth_chainId (which web3 asks before every
    call and transaction it validates) from its cache, as the chain id never changes under a client (a wrong
    chain is refused when the client starts); it sends each request on a kept-alive connection of its thread
    (`node.chain.transport`), not through `requests`."""

    def __init__(self, rpc_url: str, timeout: float):
        super().__init__(rpc_url, request_kwargs={"timeout": timeout}, exception_retry_configuration=None,
                         cache_allowed_requests=True, cacheable_requests={"eth_chainId"})
        self.requests: Counter[str] = Counter()
        self.transport = KeepAliveTransport(rpc_url, timeout)

    def _make_request(self, method: Any, request_data: bytes) -> bytes:
        self.requests[str(method)] += 1
        return self.transport.post(request_data, str(method))


class NonceManager:
    """Hands out consecutive nonces for one address under a lock."""

    def __init__(self, w3: Web3, address: str):
        self._w3 = w3
        self._address = address
        self._next: int | None = None
        self.lock = threading.Lock()

    def take(self) -> int:
        """The next nonce; call with `lock` held."""
        if self._next is None:
            self._next = self._w3.eth.get_transaction_count(self._address, "pending")
        nonce = self._next
        self._next += 1
        return nonce

    def resync(self) -> None:
        """Forget the local counter; the next `take` asks the chain. Call with `lock` held."""
        self._next = None


def fees_from_history(base_fees: list[int], rewards: list[int], suggested_priority: int | None) -> dict[str, int]:
    """EIP-1559 fees as the node's recent blocks price them: the priority fee is the median of the recent blocks'
    median priority fees (blocks with no transactions report 0 and do not count), or the node's own suggestion
    (eth_maxPriorityFeePerGas) when none paid any; the fee cap is twice the next block's base fee (eth_feeHistory's
    last base fee is the pending block's) plus the priority fee, so the transaction stays valid while the base fee
    doubles."""
    paid = sorted(r for r in rewards if r > 0)
    priority = paid[len(paid) // 2] if paid else (suggested_priority or 0)
    next_base = base_fees[-1] if base_fees else 0
    return {"maxFeePerGas": 2 * next_base + priority, "maxPriorityFeePerGas": priority}


@contextlib.contextmanager
def rpc_errors(rpc_url: str) -> Iterator[None]:
    """Translate transport failures and reverts into RollnetErrors."""
    try:
        yield
    except ContractLogicError as exc:
        raise decode_revert(exc.data if isinstance(exc.data, str) else None) from None
    except (requests.ConnectionError, requests.Timeout, ConnectionError) as exc:
        raise ChainUnavailable(f"no Ethereum node answers at {shown_url(rpc_url)} ({type(exc).__name__})") from None
    except requests.HTTPError as exc:  # a proxy in front of a node that is down or overloaded (502, 503, 429)
        raise ChainUnavailable(f"no Ethereum node answers at {shown_url(rpc_url)}: {exc}") from None
    except Web3RPCError as exc:
        message = exc.rpc_response.get("error", {}).get("message") if exc.rpc_response else None
        raise RollnetError(f"the chain refused the request: {message or exc}") from None


@contextlib.contextmanager
def unsent() -> Iterator[None]:
    """An outage while preparing a transaction (before it is signed) is `TransactionNotSent`."""
    try:
        yield
    except TransactionNotSent:
        raise
    except ChainUnavailable as exc:
        raise TransactionNotSent(str(exc)) from None


class ChainClient:
    """Talks to one chain as (at most) one sender."""

    def __init__(
        self,
        rpc_url: str,
        account: LocalAccount | None = None,
        *,
        expected_chain_id: int | None = None,
        request_timeout: float | None = None,
        receipt_timeout: float = 60.0,
        outage_seconds: float = 120.0,
    ):
        self.rpc_url = rpc_url
        self.account = account
        self.receipt_timeout = receipt_timeout
        self.outage_seconds = outage_seconds
        if request_timeout is None:
            request_timeout = float(os.environ.get(TIMEOUT_ENV, "10"))
        try:
            provider = CountingHTTPProvider(rpc_url, request_timeout)
        except ValueError as exc:
            raise RollnetError(str(exc)) from None
        self.w3 = Web3(provider)
        self.requests = provider.requests  # JSON-RPC requests sent, by method
        with rpc_errors(rpc_url):
            self.chain_id = self.w3.eth.chain_id
        if expected_chain_id is not None and self.chain_id != expected_chain_id:
            raise WrongChain(
                f"the chain at {shown_url(rpc_url)} has id {self.chain_id}, but the deployment is on chain "
                f"{expected_chain_id}"
            )
        self._nonces = NonceManager(self.w3, account.address) if account else None
        self._fees: dict[str, int] | None = None
        self._fees_at = 0.0
        self._contracts: dict[tuple[str, str], Contract] = {}
        self._decoders: dict[tuple[str, tuple[str, ...]], EventDecoder] = {}
        self._tally = threading.Lock()  # lanes send from several threads: counters are added to under it
        self.fees_paid_wei = 0  # what this client's mined transactions cost in gas, for net-gain accounting
        self.gas_used = 0  # gas of this client's mined transactions
        self.transactions = 0  # this client's mined transactions

    # -------------------------------------------------------------- reading

    @property
    def address(self) -> str:
        if self.account is None:
            raise RollnetError("this command needs a key: pass --key NAME or --dev-account N")
        return self.account.address

    def contract(self, name: str, address: str) -> Contract:
        key = (name, address)
        if key not in self._contracts:
            abi = load_artifact(name).abi
            self._contracts[key] = self.w3.eth.contract(address=Web3.to_checksum_address(address), abi=abi)
        return self._contracts[key]

    def call(self, fn: ContractFunction, block: int | str = "latest") -> Any:
        """`fn`'s result at `block`, read without web3's per-call overhead where that answers the same
        (`node.chain.calls`); reverts and anything unusual go through web3."""
        with rpc_errors(self.rpc_url):
            result = fast_call(self.w3, fn, block)
            return fn.call(block_identifier=block) if result is FALLBACK else result

    def through_outage(self, read: Callable[[], Any],
                       retry_on: type[ChainUnavailable] = ChainUnavailable) -> Any:
        """`read()`, retried while it raises `retry_on` (the chain is unavailable), for up to `outage_seconds`:
        for reading what a mined transaction of ours did, whose result the caller must not lose to an outage (a
        claimed lease), or, with `retry_on=TransactionNotSent`, for sending afresh what the outage kept from
        ever being signed."""
        outage_until = None
        while True:
            try:
                return read()
            except retry_on:
                now = time.monotonic()
                outage_until = outage_until or now + self.outage_seconds
                if now > outage_until:
                    raise
                time.sleep(0.5)

    def balance(self, address: str) -> int:
        with rpc_errors(self.rpc_url):
            return self.w3.eth.get_balance(Web3.to_checksum_address(address))

    def block_number(self) -> int:
        with rpc_errors(self.rpc_url):
            return self.w3.eth.block_number

    def block_timestamp(self, number: int) -> int:
        with rpc_errors(self.rpc_url):
            return self.w3.eth.get_block(number)["timestamp"]

    def now(self) -> int:
        """The chain's clock as the next transaction will see it: the pending block's timestamp. (The latest
        block's lags on a chain that mines only when sent a transaction, like anvil: deadlines must be
        judged by the time a transaction sent now would run at.)"""
        with rpc_errors(self.rpc_url):
            return self.w3.eth.get_block("pending")["timestamp"]

    def latest_timestamp(self) -> int:
        """The chain's clock: the latest block's timestamp."""
        with rpc_errors(self.rpc_url):
            return self.w3.eth.get_block("latest")["timestamp"]

    def rpc(self, method: str, params: list[Any]) -> Any:
        """A raw JSON-RPC call (e.g. Anvil's evm_increaseTime)."""
        with rpc_errors(self.rpc_url):
            response = self.w3.provider.make_request(method, params)
        if "error" in response:
            raise RollnetError(f"{method} failed: {response['error'].get('message')}")
        return response.get("result")

    # -------------------------------------------------------------- writing

    def transact(self, fn: ContractFunction | ContractConstructor, value: int = 0, headroom: int = 0) -> TxReceipt:
        """Send a contract transaction from our account and wait for its receipt; raise on revert. Gas is
        estimated against the pending block, where the transaction will run: a call that needs the latest
        block's hash (a lease's seed, a committee) works in the very next block. `headroom` adds gas for work
        the estimate may not see because of who lands first in the same block (a vote that draws the committee
        or decides the round); gas not used is not paid."""
        base = {"from": self.address, "value": value, "chainId": self.chain_id}
        with unsent(), rpc_errors(self.rpc_url):
            fast = fast_estimate(self.w3, fn, self.address, value, "pending")
            estimate = fast[1] if fast is not None else fn.estimate_gas(base, block_identifier="pending")
        gas = int(estimate * GAS_MARGIN) + 21_000 + headroom
        if fast is not None:  # the calldata is encoded once, as web3's build_transaction would encode it
            data = "0x" + fast[0].hex()
            return self._sign_and_send(lambda fields: {**base, "to": fn.address, "data": data, "gas": gas, **fields})
        return self._sign_and_send(lambda fields: fn.build_transaction({**base, "gas": gas, **fields}))

    def transfer(self, to: str, value: int) -> TxReceipt:
        """Send plain ETH from our account."""
        base = {"from": self.address, "to": Web3.to_checksum_address(to), "value": value,
                "chainId": self.chain_id, "gas": 21_000}
        return self._sign_and_send(lambda fields: {**base, **fields})

    def _sign_and_send(self, build: Callable[[dict], dict]) -> TxReceipt:
        """Fill fees and a fresh nonce into `build`'s transaction, sign, send, wait for the receipt."""
        assert self._nonces is not None and self.account is not None
        with unsent(), rpc_errors(self.rpc_url):
            fees = self._current_fees()
        with rpc_errors(self.rpc_url):
            with self._nonces.lock:
                tx = build({"nonce": self._nonces.take(), **fees})
                signed = self.account.sign_transaction(tx)
                delivered = True
                try:
                    self._send_raw(signed.raw_transaction, resend=False)
                except ChainUnavailable:
                    delivered = False  # the nonce is spent on these exact bytes: `_receipt` re-sends them until mined
                except BaseException:
                    self._nonces.resync()
                    raise
        receipt = self._receipt(signed.hash, signed.raw_transaction, delivered)
        with self._tally:
            self.fees_paid_wei += receipt["gasUsed"] * receipt.get("effectiveGasPrice", 0)
            self.gas_used += receipt["gasUsed"]
            self.transactions += 1
        if receipt["status"] != 1:
            self._explain_failure(tx, receipt)
        return receipt

    def _send_raw(self, raw: bytes, resend: bool) -> None:
        with rpc_errors(self.rpc_url):
            try:
                self.w3.eth.send_raw_transaction(raw)
            except Web3RPCError as exc:
                message = str(exc.rpc_response.get("error", {}).get("message", "")) if exc.rpc_response else ""
                if not resend or ("already" not in message.lower() and "nonce too low" not in message.lower()):
                    raise  # on a re-send, "already known"/"nonce too low" mean the first copy arrived

    def _receipt(self, tx_hash: bytes, raw: bytes, delivered: bool = True) -> TxReceipt:
        """Wait for the receipt of a signed transaction, re-sending its bytes while the chain is away. A send that
        failed (`delivered` False) may never have reached the node, and a nonce the node never saw is a gap every
        later transaction would queue behind: the same bytes go again first (a second copy is harmless)."""
        outage_until = None
        while True:
            try:
                if not delivered:
                    self._deliver_again(tx_hash, raw)
                    delivered = True
                with rpc_errors(self.rpc_url):
                    try:
                        return self.w3.eth.wait_for_transaction_receipt(tx_hash, timeout=self.receipt_timeout)
                    except TimeExhausted:
                        raise TransactionTimeout(f"transaction 0x{tx_hash.hex()} was sent but not mined within "
                                                 f"{self.receipt_timeout:.0f}s") from None
            except ChainUnavailable:
                now = time.monotonic()
                outage_until = outage_until or now + self.outage_seconds
                if now > outage_until:
                    raise
                log.warning("chain unavailable while 0x%s is pending; re-sending the same bytes", tx_hash.hex()[:12])
                time.sleep(0.5)
                with contextlib.suppress(ChainUnavailable):
                    self._send_raw(raw, resend=True)

    def _deliver_again(self, tx_hash: bytes, raw: bytes) -> None:
        """Send a transaction's bytes again after its first send failed on the way. If the node refuses them (fees
        moved on, funds) and does not know the transaction either, it will never be mined: its nonce is handed
        out again and the refusal raised. Refused but known means the first copy arrived: wait for it."""
        try:
            self._send_raw(raw, resend=True)
        except ChainUnavailable:
            raise
        except RollnetError as refusal:
            try:
                with rpc_errors(self.rpc_url):
                    self.w3.eth.get_transaction(tx_hash)
            except TransactionNotFound:
                assert self._nonces is not None
                with self._nonces.lock:
                    self._nonces.resync()
                raise refusal from None

    def deploy(self, name: str, *args: Any, value: int = 0) -> str:
        artifact = load_artifact(name)
        factory = self.w3.eth.contract(abi=artifact.abi, bytecode=artifact.bytecode)
        receipt = self.transact(factory.constructor(*args), value=value)
        return receipt["contractAddress"]

    def _current_fees(self) -> dict[str, int]:
        """EIP-1559 fees from the node, cached for FEE_CACHE_SECONDS (see `fees_from_history`)."""
        now = time.monotonic()
        if self._fees is None or now - self._fees_at > FEE_CACHE_SECONDS:
            history = self.w3.eth.fee_history(FEE_HISTORY_BLOCKS, "latest", [FEE_PERCENTILE])
            rewards = [int(r[0]) for r in history.get("reward") or [] if r]
            suggested = None if any(rewards) else int(self.w3.eth.max_priority_fee)
            self._fees = fees_from_history([int(b) for b in history["baseFeePerGas"]], rewards, suggested)
            self._fees_at = now
        return self._fees

    def _explain_failure(self, tx: dict, receipt: TxReceipt) -> None:
        call = {k: tx[k] for k in ("from", "to", "value", "data") if k in tx}
        with rpc_errors(self.rpc_url):
            self.w3.eth.call(call, block_identifier=receipt["blockNumber"])
        raise RollnetError(f"transaction 0x{receipt['transactionHash'].hex()} failed on chain")

    # -------------------------------------------------------------- events

    def events(self, contract: Contract, event: str, from_block: int, to_block: int | str = "latest") -> list:
        """Decoded logs of one event in a block range."""
        with rpc_errors(self.rpc_url):
            return list(contract.events[event].get_logs(from_block=from_block, to_block=to_block))

    def log_ranges(self, contract: Contract, events: list[str], start: int, end: int,
                   max_blocks: int = LOG_RANGE_BLOCKS) -> Iterator[tuple[int, list]]:
        """The decoded logs of `events` from blocks `start`..`end`, in chain order, as (last block of the range,
        logs) for consecutive ranges of at most `max_blocks` blocks: one eth_getLogs per range, however many
        event kinds, so a follower's calls grow with the blocks it covers, never with the events in them, and no
        request asks a node for more blocks than public endpoints serve."""
        low = start
        while low <= end:
            high = min(end, low + max_blocks - 1)
            yield high, self.logs(contract, events, low, high)
            low = high + 1

    def logs(self, contract: Contract, events: list[str], low: int, high: int,
             match: list[list[bytes] | None] | None = None) -> list[dict]:
        """The decoded logs (`rollnet.node.chain.logs`) of `events` in blocks `low`..`high`, in chain order, from
        one eth_getLogs. `match` narrows the topics after the event's: for topic 1, 2, 3 in turn, the 32-byte
        values accepted (None: any), e.g. one worker's address where the events index it."""
        key = (contract.address, tuple(events))
        decoder = self._decoders.get(key)
        if decoder is None:
            decoder = self._decoders[key] = EventDecoder(contract.abi, events)
        topics: list = [decoder.topics, *[None if m is None else ["0x" + t.hex() for t in m] for m in match or []]]
        with rpc_errors(self.rpc_url):
            raw = self.w3.eth.get_logs({"address": contract.address, "fromBlock": low, "toBlock": high,
                                        "topics": topics})
        logs = [log for log in map(decoder.decode, raw) if log is not None]
        logs.sort(key=lambda log: (log["blockNumber"], log["logIndex"]))
        return logs

    def follow(
        self, contract: Contract, events: list[str], from_block: int, poll_seconds: float = 0.5,
        stop: threading.Event | None = None,
    ) -> Iterator[Any]:
        """Yield decoded logs of `events` from `from_block` onward, in chain order, until `stop` is set."""
        next_block = from_block
        while stop is None or not stop.is_set():
            head = self.block_number()
            if head >= next_block:
                for _, logs in self.log_ranges(contract, events, next_block, head):
                    yield from logs
                next_block = head + 1
            else:
                time.sleep(poll_seconds)
