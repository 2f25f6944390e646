"""JSON-RPC over HTTP on one kept-alive connection per thread (`http.client`), for the chain client's provider.

`requests` spends a few hundred microseconds of CPU per POST on sessions, adapters, hooks and header merging,
around a loopback round trip that costs less; every participant polls its endpoint, so that was a visible part of
a market's CPU. This transport sends the same bytes (POST, `Content-Type: application/json`, Basic auth from the
URL's credentials, which never go into the `Host` header) and returns the body.

Invariants:
- Each thread uses its own connection, so concurrent senders (lanes) never interleave on one socket.
- A kept-alive connection the server has closed while it was idle (its socket readable, at EOF) is replaced before a
  request goes out on it.
- A request that went out is sent again (once, on a fresh connection) only if it is idempotent (a read) and a
  *reused* connection failed under it. A transaction (`eth_sendRawTransaction`, `eth_sendTransaction`) is never
  sent twice here: the node may have taken the first copy, so its failure is reported (`requests.ConnectionError`)
  and the chain client's own recovery re-sends the same bytes knowing it may be known already. A fresh
  connection's failure is never retried, so a failure is reported within the timeout rather than hidden.
- Failures surface as the `requests` exceptions the client already translates to `ChainUnavailable`:
  `requests.ConnectionError` (no answer, a refused or reset connection), `requests.Timeout`, and
  `requests.HTTPError` for an answer that says the node is away or overloaded (5xx, 408, 429). Any other status is
  the caller's mistake, not an outage: a JSON-RPC body is handed on for web3 to raise its error, anything else is a
  `RollnetError` naming the status (a wrong path, missing credentials). A body over `max_response_bytes` is refused
  before more is read.
"""

from __future__ import annotations

import base64
import http.client
import json
import select
import threading
from urllib.parse import unquote, urlsplit

import requests
from rollnet.node.errors import RollnetError

_RECYCLED = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, http.client.BadStatusLine)
NOT_IDEMPOTENT = frozenset({"eth_sendRawTransaction", "eth_sendTransaction"})
OUTAGE_STATUSES = frozenset({408, 429}) | frozenset(range(500, 600))
MAX_RESPONSE_BYTES = 256 * 1024 * 1024  # far above any honest answer (a bounded eth_getLogs range)


class KeepAliveTransport:
    """POSTs JSON-RPC bodies to one HTTP(S) endpoint and returns the response bodies."""

    def __init__(self, url: str, timeout: float, max_response_bytes: int = MAX_RESPONSE_BYTES):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"an RPC endpoint is an http:// or https:// URL, not {url!r}")
        self.url = shown_url(url)
        self.timeout = timeout
        self.max_response_bytes = max_response_bytes
        self._connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        self._host = parts.hostname
        self._port = parts.port
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = parts.netloc.rpartition("@")[2]
        self._headers = {"Content-Type": "application/json", "Accept": "application/json",
                         "Host": host, "Connection": "keep-alive"}
        if parts.username is not None:
            secret = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            self._headers["Authorization"] = "Basic " + base64.b64encode(secret).decode()
        self._local = threading.local()

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's connection and whether it has served a request before (one the server closed while it
        sat idle is replaced first)."""
        connection = getattr(self._local, "connection", None)
        if connection is not None and _closed_by_peer(connection):
            self._drop()
            connection = None
        if connection is not None:
            return connection, True
        connection = self._connection_class(self._host, self._port, timeout=self.timeout)
        self._local.connection = connection
        return connection, False

    def _drop(self) -> None:
        connection = getattr(self._local, "connection", None)
        self._local.connection = None
        if connection is not None:
            connection.close()

    def post(self, body: bytes, method: str = "") -> bytes:
        """The body of the endpoint's answer to `body` (a JSON-RPC request for `method`)."""
        for _ in range(2):
            connection, reused = self._connection()
            try:
                connection.request("POST", self._path, body=body, headers=self._headers)
                response = connection.getresponse()
                data = self._read(response)
            except _RECYCLED as exc:
                self._drop()
                if reused and method not in NOT_IDEMPOTENT:
                    continue  # a read over a connection the server dropped: once more, on a fresh one
                raise requests.ConnectionError(f"{self.url} closed the connection ({type(exc).__name__})") from None
            except TimeoutError:  # (socket.timeout is its alias)
                self._drop()
                raise requests.Timeout(f"{self.url} did not answer within {self.timeout} s") from None
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                raise requests.ConnectionError(f"no answer from {self.url} ({type(exc).__name__}: {exc})") from None
            if response.will_close:
                self._drop()
            if response.status == 200:
                return data
            if response.status in OUTAGE_STATUSES:
                raise requests.HTTPError(f"{self.url} answered HTTP {response.status} {response.reason}")
            if _is_json_rpc(data):
                return data  # the node's own error answer, raised by web3 as what it says
            raise RollnetError(f"the RPC endpoint {self.url} answered HTTP {response.status} {response.reason}: "
                               "check its URL and credentials")
        raise requests.ConnectionError(f"{self.url} closed a fresh connection before answering")

    def _read(self, response: http.client.HTTPResponse) -> bytes:
        declared = response.getheader("Content-Length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_response_bytes:
            self._drop()
            raise RollnetError(f"the RPC endpoint {self.url} sent an answer of {declared} bytes, over the "
                               f"{self.max_response_bytes} bytes this client reads")
        data = response.read(self.max_response_bytes + 1)
        if len(data) > self.max_response_bytes:
            self._drop()
            raise RollnetError(f"the RPC endpoint {self.url} sent an answer over the {self.max_response_bytes} "
                               "bytes this client reads")
        if not response.isclosed():
            response.read()  # (the length was within bounds: this only ends a chunked body)
        return data

    def close(self) -> None:
        self._drop()


def shown_url(url: str) -> str:
    """`url` as messages may show it: without the credentials it may carry."""
    parts = urlsplit(url)
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl() if "@" in parts.netloc else url


def _closed_by_peer(connection: http.client.HTTPConnection) -> bool:
    """Whether an idle kept-alive connection's socket is readable: between requests the server has nothing to say,
    so readable means it closed the connection (or broke the protocol): either way it cannot be reused."""
    sock = connection.sock
    if sock is None:
        return False  # not connected yet: `request` connects
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _is_json_rpc(data: bytes) -> bool:
    try:
        answer = json.loads(data)
    except ValueError:
        return False
    return isinstance(answer, dict) and "jsonrpc" in answer and ("error" in answer or "result" in answer)
