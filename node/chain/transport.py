"""JSON-RPC over HTTP on one kept-alive connection per thread (`http.client`), for the chain client's provider.

`requests` spends a few hundred microseconds of CPU per POST on sessions, adapters, hooks and header merging,
around a loopback round trip that costs less; every participant polls its endpoint, so that was a visible part of
a market's CPU. This transport sends the same bytes (POST, `Content-Type: application/json`) and returns the body.

Invariants:
- Each thread uses its own connection, so concurrent senders (lanes) never interleave on one socket.
- A request is re-sent once, on a fresh connection, only when a *reused* connection turns out to have been closed
  by the server before it answered (an idle keep-alive timeout); a fresh connection's failure is never retried,
  so a failure is reported within the timeout rather than hidden.
- Failures surface as the `requests` exceptions the client already translates: `requests.ConnectionError` (no
  answer, a refused or reset connection) and `requests.Timeout`; an HTTP status other than 200 raises
  `requests.HTTPError` naming it. So `rpc_errors` turns each into `ChainUnavailable` or a clear error as before.
"""

from __future__ import annotations

import http.client
import socket
import threading
from urllib.parse import urlsplit

import requests

_RECYCLED = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, http.client.BadStatusLine)


class KeepAliveTransport:
    """POSTs JSON-RPC bodies to one HTTP(S) endpoint and returns the response bodies."""

    def __init__(self, url: str, timeout: float):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"an RPC endpoint is an http:// or https:// URL, not {url!r}")
        self.url = url
        self.timeout = timeout
        self._connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        self._host = parts.hostname
        self._port = parts.port
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._headers = {"Content-Type": "application/json", "Accept": "application/json",
                         "Host": parts.netloc, "Connection": "keep-alive"}
        self._local = threading.local()

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's connection and whether it has served a request before."""
        connection = getattr(self._local, "connection", None)
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

    def post(self, body: bytes) -> bytes:
        for _ in range(2):
            connection, reused = self._connection()
            try:
                connection.request("POST", self._path, body=body, headers=self._headers)
                response = connection.getresponse()
                data = response.read()
            except _RECYCLED as exc:
                self._drop()
                if reused:
                    continue  # the server closed an idle connection: once more, on a fresh one
                raise requests.ConnectionError(f"{self.url} closed the connection ({type(exc).__name__})") from None
            except (TimeoutError, socket.timeout):
                self._drop()
                raise requests.Timeout(f"{self.url} did not answer within {self.timeout} s") from None
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                raise requests.ConnectionError(f"no answer from {self.url} ({type(exc).__name__}: {exc})") from None
            if response.will_close:
                self._drop()
            if response.status != 200:
                raise requests.HTTPError(f"{self.url} answered HTTP {response.status} {response.reason}")
            return data
        raise requests.ConnectionError(f"{self.url} closed a fresh connection before answering")

    def close(self) -> None:
        self._drop()
