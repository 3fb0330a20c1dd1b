"""A client for policy servers speaking the openpi websocket protocol (see wire.py).

Every way the transport can fail is a PolicyTransportError: the harness records such a trial as
an infrastructure failure, never as a bad policy. A reply that does not come within
`timeout_s` closes the session: a late action chunk must never be applied to a scene that has
moved on.

A server's frames are untrusted: a reply over `max_reply_bytes` (default 16 MiB, the registry's
`policies.<id>.max_reply_mb`; actions and metadata are kilobytes) is refused by the websocket
layer from its header, before it is read, and every frame decodes within wire.py's bounds
(objects, depth, dtypes, image sizes), so what a hostile server costs is bounded by the limit.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextlib import ExitStack
from typing import Any

import numpy as np
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.sync.client import ClientConnection, connect

from pytest_gap.errors import InfraFailure
from pytest_gap.policies.credentials import API_KEY_HEADER, API_KEY_SCHEME
from pytest_gap.policies.endpoint import DEFAULT_MAX_REPLY_MB
from pytest_gap.policies.wire import (
    MAX_QUEUED_FRAMES,
    MESSAGE_TOO_BIG_CLOSE,
    VLA_PROTOCOL_VERSION,
    WireError,
    pack_vla,
    packer,
    unpack_vla,
    unpackb,
)
from pytest_gap.redaction import redact_values


class PolicyTransportError(InfraFailure):
    """The policy server could not be reached, failed, closed, or answered too late.

    `reason` is the cause alone (`ConnectionRefusedError: ...`), for a caller whose own message
    names the server and the fix already (the preflight)."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason or message


MAX_DETAIL_CHARS = 300  # of a server's own error text quoted in ours: one readable line


def _detail(text: Any) -> str:
    """A server's error text as one line of at most MAX_DETAIL_CHARS (a hostile server's
    16 MiB of newlines must not become our error message)."""
    line = " ".join(str(text).split())
    return line if len(line) <= MAX_DETAIL_CHARS else line[: MAX_DETAIL_CHARS - 3] + "..."


OUR_SERVER_LIMIT = "gap policy serve NAME --max-message-mb MB"
REPLY_LIMIT = "policies.<id>.max_reply_mb"


def _closed(
    server: str, exc: ConnectionClosed, sent_bytes: int, limit: str = OUR_SERVER_LIMIT
) -> PolicyTransportError:
    """The error for a closed connection; an oversize message says whose limit it met and how
    to raise it (websockets closes with 1009 and names the limit in the reason)."""
    if not exc.rcvd_then_sent and exc.sent is not None and exc.sent.code == MESSAGE_TOO_BIG_CLOSE:
        return PolicyTransportError(
            f"{server} sent a frame over our limit ({exc.sent.reason}); the session was closed. "
            f"If the server is honest, raise the limit ({REPLY_LIMIT}, default "
            f"{DEFAULT_MAX_REPLY_MB} MB)"
        )
    if exc.rcvd is not None and exc.rcvd.code == MESSAGE_TOO_BIG_CLOSE:
        return PolicyTransportError(
            f"{server} refused our {sent_bytes / 2**20:.1f} MiB message as too big "
            f"({exc.rcvd.reason or 'close 1009'}); raise its limit ({limit}) or send smaller "
            "observations"
        )
    return PolicyTransportError(f"{server} closed the connection ({exc})")


class PolicyClient:
    """openpi protocol: metadata frame on connect, then one action dict per observation."""

    def __init__(
        self,
        url: str,
        *,
        connect_timeout_s: float = 5.0,
        timeout_s: float = 30.0,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_MB * 2**20,
    ):
        self.url, self.timeout_s = url, timeout_s
        self._sent_bytes = 0
        self._pack = packer().pack
        headers = dict(headers or {})
        if api_key:  # openpi-client's own form (WebsocketClientPolicy(api_key=))
            headers[API_KEY_HEADER] = f"{API_KEY_SCHEME} {api_key}"
        # Entered as a context manager: the form every websockets version supports without
        # deprecation warnings; close() exits it.
        self._stack = ExitStack()
        try:
            self._ws: ClientConnection | None = self._stack.enter_context(
                connect(
                    url,
                    compression=None,
                    max_size=max_reply_bytes,
                    max_queue=MAX_QUEUED_FRAMES,
                    open_timeout=connect_timeout_s,
                    additional_headers=headers or None,
                )
            )
            self.metadata: dict[str, Any] = self._receive("metadata")
        except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
            reason = redact_values(f"{type(exc).__name__}: {exc}", headers.values())
            raise PolicyTransportError(
                f"policy server {url} is unreachable ({reason}); start it "
                "(gap policy serve NAME --port P) or fix the url",
                reason,
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
            raise _closed(f"policy server {self.url}", exc, self._sent_bytes) from None
        if isinstance(frame, str):  # openpi servers report failures as a text frame
            self.close()
            last = frame.strip().splitlines()[-1] if frame.strip() else "no detail"
            raise PolicyTransportError(f"policy server {self.url} failed: {_detail(last)}")
        try:
            return unpackb(frame, what)
        except WireError as exc:
            self.close()
            raise PolicyTransportError(
                f"policy server {self.url} sent a frame we refuse: {exc}"
            ) from None

    def infer(self, obs: dict) -> dict:
        if self._ws is None:
            raise PolicyTransportError(f"policy server {self.url}: the session is closed")
        frame = self._pack(obs)
        self._sent_bytes = len(frame)
        try:
            self._ws.send(frame)
        except ConnectionClosed as exc:
            self.close()
            raise _closed(f"policy server {self.url}", exc, self._sent_bytes) from None
        return self._receive("action")

    def close(self) -> None:
        self._ws = None
        self._stack.close()

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class VlaEvalClient:
    """vla-eval protocol: HELLO handshake, EPISODE_START, OBSERVATION -> ACTION, EPISODE_END.

    Observations are sent as given: the registry entry's obs_format (policies/formats.py) makes
    them what vla-eval's own LIBERO benchmark sends. `metadata` is the HELLO reply, with the
    server's `observation_params`. run_policy starts and ends each episode with the payloads
    vla-eval's loop sends (skills/policy.py `_protocol_episode`); `infer` outside an episode
    starts one with `{}`, for a caller that knows no episode (gap eval's relay).
    """

    def __init__(
        self,
        url: str,
        *,
        connect_timeout_s: float = 5.0,
        timeout_s: float = 30.0,
        headers: Mapping[str, str] | None = None,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_MB * 2**20,
    ):
        self.url, self.timeout_s = url, timeout_s
        self._seq = 0
        self._stack = ExitStack()
        headers = dict(headers or {})
        try:
            self._ws: ClientConnection | None = self._stack.enter_context(
                connect(
                    url,
                    compression=None,
                    max_size=max_reply_bytes,
                    max_queue=MAX_QUEUED_FRAMES,
                    open_timeout=connect_timeout_s,
                    additional_headers=headers or None,
                )
            )
        except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
            reason = redact_values(f"{type(exc).__name__}: {exc}", headers.values())
            raise PolicyTransportError(
                f"vla-eval server {url} is unreachable ({reason}); start it or fix the url", reason
            ) from None
        from pytest_gap import __version__

        hello = {
            "harness_version": f"pytest-gap {__version__}",
            "protocol_version": VLA_PROTOCOL_VERSION,
            "benchmark": "pytest-gap/libero",
        }
        self.metadata: dict[str, Any] = self._request("hello", hello, expect="hello")
        self._in_episode = False

    def _request(self, kind: str, payload: dict, expect: str | None) -> Any:
        if self._ws is None:
            raise PolicyTransportError(f"vla-eval server {self.url}: the session is closed")
        self._seq += 1
        frame = pack_vla(kind, payload, self._seq, time.time())
        try:
            self._ws.send(frame)
            if expect is None:
                return None
            reply = self._ws.recv(timeout=self.timeout_s)
        except TimeoutError:
            self.close()
            raise PolicyTransportError(
                f"vla-eval server {self.url} sent no {expect} within {self.timeout_s:g} s; the "
                "session was closed so that a late reply is never applied"
            ) from None
        except ConnectionClosed as exc:
            self.close()
            raise _closed(
                f"vla-eval server {self.url}", exc, len(frame), "the server's max message size"
            ) from None
        try:
            message = unpack_vla(reply) if isinstance(reply, bytes) else None
        except WireError as exc:
            self.close()
            raise PolicyTransportError(
                f"vla-eval server {self.url} sent a frame we refuse: {exc}"
            ) from None
        if message is None or message["type"] == "error" or message["type"] != expect:
            self.close()
            detail = message["payload"] if message else reply
            raise PolicyTransportError(f"vla-eval server {self.url} failed: {_detail(detail)}")
        return message["payload"]

    def episode_start(self, config: dict | None = None) -> None:
        self._request("episode_start", config or {}, expect=None)
        self._in_episode = True

    def infer(self, obs: dict) -> dict:
        if not self._in_episode:
            self.episode_start({})
        reply = dict(self._request("observation", obs, expect="action"))
        if "actions" in reply:
            reply["actions"] = np.atleast_2d(np.asarray(reply["actions"]))
        return reply

    def episode_end(self, result: dict | None = None) -> None:
        if self._in_episode and self._ws is not None:
            self._request("episode_end", result or {}, expect=None)
        self._in_episode = False

    def close(self) -> None:
        self._ws = None
        self._stack.close()

    def __enter__(self) -> VlaEvalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect_policy(url: str, protocol: str = "openpi", **kwargs) -> PolicyClient | VlaEvalClient:
    """A client for `url` speaking `protocol` (a registry entry's `protocol:`)."""
    if protocol == "vla-eval":
        return VlaEvalClient(url, **kwargs)
    return PolicyClient(url, **kwargs)
