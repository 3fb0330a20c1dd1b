"""A client for policy servers speaking the openpi websocket protocol (see wire.py).

Every way the transport can fail is a PolicyTransportError: the harness records such a trial as
an infrastructure failure, never as a bad policy. A reply that does not come within
`timeout_s` closes the session: a late action chunk must never be applied to a scene that has
moved on.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.sync.client import ClientConnection, connect

from pytest_gap.errors import InfraFailure
from pytest_gap.policies.wire import WireError, packb, unpackb


class PolicyTransportError(InfraFailure):
    """The policy server could not be reached, failed, closed, or answered too late."""


class PolicyClient:
    def __init__(
        self,
        url: str,
        *,
        connect_timeout_s: float = 5.0,
        timeout_s: float = 30.0,
        api_key: str | None = None,
    ):
        self.url, self.timeout_s = url, timeout_s
        headers = {"Authorization": f"Api-Key {api_key}"} if api_key else None
        # Entered as a context manager: the form every websockets version supports without
        # deprecation warnings; close() exits it.
        self._stack = ExitStack()
        try:
            self._ws: ClientConnection | None = self._stack.enter_context(
                connect(
                    url,
                    compression=None,
                    max_size=None,
                    open_timeout=connect_timeout_s,
                    additional_headers=headers,
                )
            )
            self.metadata: dict[str, Any] = self._receive("the metadata frame")
        except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
            raise PolicyTransportError(
                f"policy server {url} is unreachable ({type(exc).__name__}: {exc}); start it "
                "(gap policy serve NAME --port P) or fix the url"
            ) from None

    def _receive(self, what: str) -> Any:
        if self._ws is None:
            raise PolicyTransportError(f"policy server {self.url}: the session is closed")
        try:
            frame = self._ws.recv(timeout=self.timeout_s)
        except TimeoutError:
            self.close()
            raise PolicyTransportError(
                f"policy server {self.url} sent no {what} within {self.timeout_s:g} s; the "
                "session was closed so that a late reply is never applied"
            ) from None
        except ConnectionClosed as exc:
            self.close()
            raise PolicyTransportError(
                f"policy server {self.url} closed the connection ({exc})"
            ) from None
        if isinstance(frame, str):  # openpi servers report failures as a text frame
            self.close()
            last = frame.strip().splitlines()[-1] if frame.strip() else "no detail"
            raise PolicyTransportError(f"policy server {self.url} failed: {last}")
        try:
            return unpackb(frame)
        except WireError as exc:
            self.close()
            raise PolicyTransportError(f"policy server {self.url}: {exc}") from None

    def infer(self, obs: dict) -> dict:
        if self._ws is None:
            raise PolicyTransportError(f"policy server {self.url}: the session is closed")
        try:
            self._ws.send(packb(obs))
        except ConnectionClosed as exc:
            self.close()
            raise PolicyTransportError(
                f"policy server {self.url} closed the connection ({exc})"
            ) from None
        return self._receive("action")

    def close(self) -> None:
        self._ws = None
        self._stack.close()

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
