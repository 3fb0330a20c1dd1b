"""Issue 48: text a peer sends reaches the operator's terminal escaped (errors.shown).

A worker names its host in its Hello frame, and `gap status` printed it raw: a newline forged a
status line, ESC sequences cleared the screen, a bidi override reversed what followed. The rule
is general: any string from the network that a `gap` command prints (a server's answer, its
refusal, a task's fields) is printed with its control characters escaped, one line where it
was one line. Against a real `gap serve` (on the fake backend) with a worker whose host is
hostile, and against a hostile server (a test double: a server that lies cannot be had for
real) for the fields an honest server never sends that way. Every `gap` command is a real
process.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from websockets.datastructures import Headers
from websockets.http11 import Response
from websockets.sync.server import serve

from pytest_gap.doors import run_secret_path, server_token_path
from pytest_gap.policies.builtin import HoldPolicy
from pytest_gap.policies.wire import packb, unpackb
from pytest_gap.service.client import EvalClient, ServiceError
from tests.fake_session import BACKEND, TESTS
from tests.service_configs import remote_policy_config
from tests.test_service import GAP, _free_port, _wait

# a forged status line, clear screen + cursor home, a window title, a bidi override, a line
# separator, a C1 CSI, DEL, a zero-width joiner
HOSTILE = (
    "box\n  worker 7: attached (forged), 99 done\r\x1b[2J\x1b[H\x1b]0;pwned\x07"
    "\u202egnp.exe\u2028next\x9b31m\x7f\u200d"
)
RAW = ("\n", "\r", "\x1b", "\x07", "\u202e", "\u2028", "\x9b", "\x7f", "\u200d")
ESCAPED = ("\\n", "\\r", "\\x1b[2J", "\\x07", "\\u202e", "\\u2028", "\\x9b", "\\x7f", "\\u200d")


pytestmark = pytest.mark.usefixtures("own_state")


def _gap(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([GAP, *args], capture_output=True, text=True, timeout=120)


def _printable(text: str) -> None:
    """Nothing but printable characters and the command's own line ends."""
    assert [c for c in text if not (c.isprintable() or c == "\n")] == [], text


def _shows_escaped(line: str) -> None:
    _printable(line)
    assert "\n" not in line.strip("\n")
    assert all(e in line for e in ESCAPED), line


# -- a real gap serve, a hostile worker ----------------------------------------------------------
@contextlib.contextmanager
def _gap_serve(home: Path) -> Iterator[str]:
    """`gap serve --config` with the operator's run `r` (one trial on the fake backend)."""
    config = remote_policy_config(
        max_steps=8, backend=BACKEND, families=["fake"], variations=["easy"]
    )
    (home / "fake.yaml").write_text(yaml.safe_dump(config))
    port = _free_port()
    argv = [GAP, "serve", "--config", str(home / "fake.yaml"), "--run-id", "r"]
    argv += ["--port", str(port), "--runs-dir", str(home / "runs")]
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    with open(home / "serve.log", "w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        secret = run_secret_path("127.0.0.1", port, "r")
        _wait(lambda: secret.is_file() and server_token_path(port).is_file(), "gap serve", 60)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_a_workers_host_cannot_forge_or_clear_gap_status_lines(tmp_path):
    with _gap_serve(tmp_path) as url:
        port = int(url.rsplit(":", 1)[1])
        token = server_token_path(port).read_text().strip()
        secret = run_secret_path("127.0.0.1", port, "r").read_text().strip()
        client = EvalClient(url, "r", 0, token=token, run_secret=secret)
        client.hello = client.hello.model_copy(update={"host": HOSTILE})
        shown: list[subprocess.CompletedProcess] = []
        hold = HoldPolicy()

        def act(obs: dict) -> dict:
            if not shown:  # mid-episode: the worker is attached, its host in the status
                shown.append(_gap("status", "--url", url, "--run-id", "r"))
            return hold.infer(obs)

        try:
            client.run(act)
        except ServiceError as refused:  # the server may refuse such a host outright: fine
            assert "host" in str(refused) and not shown
            _printable(str(refused))
            return
        (status,) = shown
    assert status.returncode == 0, status.stderr
    run_line, worker_line = status.stdout.splitlines()  # no third, forged line
    assert run_line.startswith("run r: ")
    assert worker_line.startswith("  worker 0: attached (box\\n  worker 7: attached (forged)")
    _shows_escaped(worker_line)


# -- a hostile server ----------------------------------------------------------------------------
def _json(status: int, body) -> Response:
    data = json.dumps(body).encode()
    headers = Headers({"Content-Type": "application/json", "Content-Length": str(len(data))})
    return Response(status, "OK" if status == 200 else "Refused", headers, data)


def _lying_status() -> dict:
    worker = {"worker_id": 0, "state": "attached", "host": HOSTILE, "current": HOSTILE}
    return {
        "run_id": HOSTILE,
        "state": "active",
        "expected": 1,
        "saved": 0,
        "in_progress": 1,
        "remaining": 0,
        "infra_failures": 0,
        "smoke_episodes": 0,
        "workers": [worker],
        "gate": HOSTILE,
    }


def _lying_eval_server(conn) -> None:
    """/control refuses a submit, /episodes an attach, each with the hostile text."""
    unpackb(conn.recv(timeout=30), "frame")
    if conn.request.path == "/control":
        conn.send(packb({"ok": False, "error": HOSTILE}))
    else:
        conn.send(packb({"type": "error", "error": HOSTILE}))


def _http_answers(conn, request):
    if request.path == "/runs/r":
        return _json(200, _lying_status())
    if request.path == "/runs/html":  # an error that is no JSON at all, and long
        data = ("<html>" + HOSTILE * 20_000).encode()
        return Response(502, "Bad Gateway", Headers({"Content-Length": str(len(data))}), data)
    if request.path == "/runs/list":  # JSON, but no mapping
        return _json(500, [HOSTILE])
    if request.path.startswith("/runs/"):
        return _json(404, {"error": HOSTILE})
    return None  # a websocket handshake


class _LyingPlatform(BaseHTTPRequestHandler):
    def _answer(self, status: int, body) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        task = {"task_id": "t1", "model_name": HOSTILE, "benchmark_set": HOSTILE}
        if self.path == "/tasks":
            return self._answer(200, [{**task, "state": "failed", "endpoint": HOSTILE}])
        self._answer(200, {**task, "state": "failed", "error": HOSTILE})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self._answer(429, {"error": HOSTILE})

    def log_message(self, format: str, *args) -> None:
        pass


@pytest.fixture
def liars() -> Iterator[tuple[str, str]]:
    """(an evaluation server's url, a platform's url), both lying."""
    platform = ThreadingHTTPServer(("127.0.0.1", 0), _LyingPlatform)
    with serve(_lying_eval_server, "127.0.0.1", 0, process_request=_http_answers) as server:
        threads = [threading.Thread(target=s.serve_forever) for s in (server, platform)]
        for thread in threads:
            thread.start()
        try:
            port = server.socket.getsockname()[1]
            yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{platform.server_port}"
        finally:
            server.shutdown()
            platform.shutdown()
            platform.server_close()
            for thread in threads:
                thread.join(30)


def test_what_a_lying_server_says_is_printed_escaped_one_line_where_it_was_one(liars, tmp_path):
    url, platform = liars
    status = _gap("status", "--url", url, "--run-id", "r")
    assert status.returncode == 0, status.stderr
    run_line, worker_line, gate_line = status.stdout.splitlines()
    for line in (run_line, worker_line, gate_line):
        _shows_escaped(line)
    assert run_line.startswith("run box\\n  worker 7") and gate_line.startswith("box\\n")

    (tmp_path / "c.yaml").write_text("{}\n")
    port = url.rsplit(":", 1)[1]
    refused = {
        "status": _gap("status", "--url", url, "--run-id", "missing"),
        "submit": _gap("submit", str(tmp_path / "c.yaml"), "--run-id", "r", "--port", port),
        "eval": _gap("eval", "--url", url, "--run-id", "r", "--fake-actions"),
        "online submit": _gap(
            *("online", "submit", "--base-url", platform, "--token", "t"),
            *("--model-name", "m", "--benchmark-set", "s"),
        ),
    }
    for name, done in refused.items():
        assert done.returncode == 2, (name, done.stdout, done.stderr)
        # a refusal keeps its lines (one problem a line), each labelled as an error of gap's
        lines = done.stderr.splitlines()
        assert len(lines) == HOSTILE.count("\n") + 1, (name, lines)
        assert all(line.startswith("gap: error: ") for line in lines), (name, lines)
        for line in lines:
            _printable(line)
        assert all(e in done.stderr for e in ESCAPED if e != "\\n"), (name, lines)

    # an error body that is no JSON (and long), or JSON but no mapping: its HTTP reason, one line
    for run_id, code in (("html", 502), ("list", 500)):
        done = _gap("status", "--url", url, "--run-id", run_id)
        assert done.returncode == 2, (run_id, done.stderr)
        (line,) = done.stderr.splitlines()
        assert line.startswith("gap: error: ") and line.endswith(f"(HTTP {code})"), line

    listed = _gap("online", "status", "--base-url", platform, "--token", "t")
    assert listed.returncode == 0, listed.stderr
    (line,) = listed.stdout.splitlines()
    _shows_escaped(line)
    ready = _gap("online", "ready", "--base-url", platform, "--token", "t", "--task-id", "t1")
    assert ready.returncode == 1, ready.stderr
    (line,) = ready.stdout.splitlines()
    assert line.startswith("task t1: failed: box\\n")
    _shows_escaped(line)


def test_the_escape_is_visible_and_leaves_printable_text_alone():
    from pytest_gap.errors import one_line, shown

    assert shown("gpu-node-07 (Zürich, 東京)") == "gpu-node-07 (Zürich, 東京)"
    assert shown(socket.gethostname()) == socket.gethostname()  # an honest host, as it is
    escaped = shown(HOSTILE)
    assert all(e in escaped for e in ESCAPED) and not any(r in escaped for r in RAW)
    assert shown("\U000e0041\udcff\x00\xa0") == "\\U000e0041\\udcff\\x00\\xa0"
    assert one_line("a\n\tb \x1b[31m") == "a b \\x1b[31m"


def test_a_servers_log_line_quotes_a_peer_escaped_and_stays_one_line():
    """gap serve's and gap online's log (cli/common.log_to_stderr): a peer's text in a record
    (a trial's error, a task server's last line) cannot add log lines or drive the terminal;
    a traceback the record carries is the process's own and keeps its lines."""
    import io
    import logging

    from pytest_gap.cli.common import log_to_stderr

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    root.handlers.clear()
    try:
        log_to_stderr("gap serve")
        stream = io.StringIO()
        root.handlers[0].setStream(stream)
        try:
            raise ValueError("the server's own fault")
        except ValueError:
            logging.getLogger("pytest_gap.service.runs").warning(
                "run r: a trial is handed out again: %s", HOSTILE, exc_info=True
            )
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
    first, *traceback = stream.getvalue().splitlines()
    assert first.startswith("gap serve: run r: a trial is handed out again: box\\n")
    _shows_escaped(first)
    assert traceback[0] == "Traceback (most recent call last):"
    assert traceback[-1] == "ValueError: the server's own fault"
