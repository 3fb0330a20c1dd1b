"""Clients of the evaluation server: `EvalClient` attaches as one worker and answers every
observation with `act(obs)`; `policy_act` makes `act` from an openpi or vla-eval policy server;
`submit` and `run_status` are the control plane. `gap eval`, `gap submit` and `gap status` are
thin commands over these.

Where a client's secrets come from when it is given none: the token `gap serve` made and wrote
for its port (`local_token`, for a server on this machine only: a token is never sent to another
host because of a file that happens to be here), and the run secret `gap submit` kept for the
server and run id (`stored_run_secret`)."""

from __future__ import annotations

import contextlib
import json
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from pytest_gap.bind import is_loopback
from pytest_gap.doors import read_secret, run_secret_path, server_token_path, write_secret
from pytest_gap.errors import GapError, shown, shown_lines
from pytest_gap.policies.wire import MAX_QUEUED_FRAMES, packb, unpackb
from pytest_gap.service.protocol import (
    CONTROL_PATH,
    EPISODES_PATH,
    RUNS_PATH,
    Hello,
    RunStatus,
    Submit,
    Submitted,
)

MAX_FRAME_BYTES = 64 * 2**20
MAX_ERROR_BYTES = 64 * 2**10  # of a refusal's body: a line or a few, never megabytes
# A connectivity smoke's answer: five steps of no motion with the gripper open (openpi's
# `actions` chunk). Episodes answered so are labelled smoke and never scored.
FAKE_REPLY = {"actions": np.tile(np.array([0, 0, 0, 0, 0, 0, -1.0]), (5, 1))}


class ServiceError(GapError):
    """The server refused, or could not be reached; the message says which and why."""


def _base(url: str, scheme: str) -> str:
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https", "ws", "wss") or not parts.hostname:
        raise ServiceError(f"--url {url}: give the evaluation server as http://HOST:PORT")
    secure = parts.scheme in ("https", "wss")
    scheme = {"ws": "wss" if secure else "ws", "http": "https" if secure else "http"}[scheme]
    return urlunsplit((scheme, parts.netloc, "", "", ""))


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(_base(url, "http"))
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def local_token(url: str) -> str | None:
    """The token `gap serve` wrote for the url's port, if the url is this machine's loopback
    and the file is there (None otherwise)."""
    host, port = _host_port(url)
    path = server_token_path(port)
    if not is_loopback(host) or not path.is_file():
        return None
    return read_secret(path, f"the token file of gap serve on port {port} ({path})")


def run_secret_file(url: str, run_id: str) -> Path:
    """Where `gap submit` keeps the secret of `run_id` on the server at `url`."""
    return run_secret_path(*_host_port(url), run_id)


def store_run_secret(url: str, run_id: str, secret: str) -> Path:
    return write_secret(run_secret_file(url, run_id), secret)


def stored_run_secret(url: str, run_id: str) -> str | None:
    path = run_secret_file(url, run_id)
    return read_secret(path, f"the run secret file {path}") if path.is_file() else None


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _connect(url: str, path: str, token: str | None):
    target = _base(url, "ws") + path
    try:
        return connect(
            target,
            additional_headers=_headers(token),
            max_size=MAX_FRAME_BYTES,
            max_queue=MAX_QUEUED_FRAMES,
            compression=None,
        )
    except InvalidStatus as exc:
        code = exc.response.status_code
        why = "missing or wrong token (--token-file)" if code == 401 else f"HTTP {code}"
        if code == 403:  # a door's own one-line reason (plain, or a JSON error)
            body = exc.response.body[:MAX_ERROR_BYTES].decode(errors="replace").strip()
            with contextlib.suppress(ValueError, AttributeError):
                body = str(json.loads(body).get("error", body))
            why = shown_lines(body or why)
        raise ServiceError(f"{_base(url, 'http')} refused the connection: {why}") from None
    except OSError as exc:
        raise ServiceError(f"cannot reach the evaluation server at {url}: {exc}") from None


def _error_of(exc: urllib.error.HTTPError) -> str:
    """The error a server's HTTP refusal states (its JSON `error`, else its reason), escaped:
    read at most MAX_ERROR_BYTES of it, and never trusted to be JSON, a mapping or a string."""
    try:
        body = exc.read(MAX_ERROR_BYTES)
    except OSError:
        body = b""
    detail: object = exc.reason
    with contextlib.suppress(ValueError, AttributeError):
        detail = json.loads(body or b"{}").get("error", exc.reason)
    return shown_lines(detail)


def submit(url: str, config: Path, run_id: str, token: str | None = None) -> Submitted:
    """Schedule `config`'s trials on the server under `run_id` (idempotent)."""
    try:
        text = config.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ServiceError(f"{config}: cannot read the config: {exc}") from None
    request = Submit(run_id=run_id, config_name=config.name, config_text=text)
    with _connect(url, CONTROL_PATH, token) as ws:
        ws.send(packb(request.model_dump()))
        answer = unpackb(ws.recv(), "answer")
    if not answer.get("ok"):
        raise ServiceError(f"gap submit refused: {shown_lines(answer.get('error'))}")
    return Submitted.model_validate({k: v for k, v in answer.items() if k != "ok"})


def run_status(url: str, run_id: str, token: str | None = None) -> RunStatus:
    request = urllib.request.Request(
        _base(url, "http") + RUNS_PATH + run_id, headers=_headers(token)
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return RunStatus.model_validate(json.loads(answer.read()))
    except urllib.error.HTTPError as exc:
        detail = _error_of(exc)
        raise ServiceError(f"{_base(url, 'http')}: {detail} (HTTP {exc.code})") from None
    except OSError as exc:
        raise ServiceError(f"cannot reach the evaluation server at {url}: {exc}") from None


class EvalClient:
    """One worker of a run: attach, answer observations until the server says finished. A token
    or run secret not given is found as `gap eval` finds it (`local_token`,
    `stored_run_secret`)."""

    def __init__(
        self,
        url: str,
        run_id: str,
        worker_id: int,
        *,
        token: str | None = None,
        smoke: bool = False,
        metadata: dict | None = None,
        run_secret: str | None = None,
    ):
        self.url = url
        self.token = token if token is not None else local_token(url)
        if run_secret is None:
            run_secret = stored_run_secret(url, run_id)
        self.hello = Hello(
            run_id=run_id,
            worker_id=worker_id,
            smoke=smoke,
            host=socket.gethostname(),
            metadata=metadata or {},
            run_secret=run_secret or "",
        )
        self.answered = 0

    def run(self, act: Callable[[dict], dict]) -> dict[str, Any]:
        """Answer every observation with `act(obs)`; returns the server's `finished` frame."""
        with _connect(self.url, EPISODES_PATH, self.token) as ws:
            ws.send(packb(self.hello.model_dump()))
            while True:
                try:
                    frame = unpackb(ws.recv(), "frame")
                except ConnectionClosed:
                    raise ServiceError(
                        f"the evaluation server closed worker {self.hello.worker_id}'s "
                        "connection before the run finished"
                    ) from None
                kind = frame.get("type") if isinstance(frame, dict) else None
                if kind == "obs":
                    ws.send(packb({"type": "reply", "reply": dict(act(frame["obs"]))}))
                    self.answered += 1
                elif kind == "finished":
                    return frame
                elif kind == "error":
                    why = shown_lines(frame.get("error"))
                    raise ServiceError(f"the evaluation server refused: {why}")
                else:
                    what = shown(repr(kind))[:80]
                    raise ServiceError(f"the evaluation server sent an unknown frame {what}")


def policy_act(
    url: str, protocol: str = "openpi", headers: dict[str, str] | None = None
) -> tuple[Callable[[dict], dict], dict]:
    """`act` that asks a policy server (openpi or vla-eval protocol, with the credentials'
    `headers` it wants), and its metadata."""
    from pytest_gap.policies.client import connect_policy

    client = connect_policy(url, protocol, headers=headers)
    return client.infer, dict(getattr(client, "metadata", None) or {})


# -- the online platform ------------------------------------------------------------------------
def _platform(base_url: str, token: str, method: str, path: str, body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    headers = {**_headers(token), "Content-Type": "application/json"}
    request = urllib.request.Request(
        _base(base_url, "http") + path, data=data, headers=headers, method=method
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        detail = _error_of(exc)
        raise ServiceError(f"{_base(base_url, 'http')}: {detail} (HTTP {exc.code})") from None
    except OSError as exc:
        raise ServiceError(f"cannot reach the platform at {base_url}: {exc}") from None


def online_submit(
    base_url: str, token: str, model_name: str, benchmark_set: str, key: str | None = None
) -> dict:
    """Create a task (or find the pending one a retried submit already made)."""
    body = {"model_name": model_name, "benchmark_set": benchmark_set, "idempotency_key": key}
    return _platform(base_url, token, "POST", "/tasks", body)


def online_task(base_url: str, token: str, task_id: str) -> dict:
    return _platform(base_url, token, "GET", f"/tasks/{task_id}")


def online_tasks(base_url: str, token: str) -> list[dict]:
    return _platform(base_url, token, "GET", "/tasks")
