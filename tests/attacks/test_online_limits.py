"""Attacks on `gap online serve`'s limits, against a real platform process on loopback: an owner
past its quota, a full queue, a ready task nobody attaches to, and HTTP requests that lie about
their bodies or never finish them. Each is refused in one line (or its connection closed) and
the next honest client is served. No episode runs: a task is ready once its evaluation server
is up and the set submitted, which needs no simulator."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.test_service import GAP, _config, _free_port, _wait

ALICE, BOB = "alice-token-0123456789", "bob-token-9876543210"
SET = "libero_smoke"
REQUEST_TIMEOUT_S = 2.0  # the platform's --request-timeout-s in these tests


@contextlib.contextmanager
def _platform(home: Path, *options: str):
    """A `gap online serve` process (capacity 1) with `options`; yields its URL."""
    (home / "tokens").write_text(f"{ALICE} alice\n{BOB} bob\n")
    _config(home / "smoke.yaml", tasks=(0,))
    (home / "sets.yaml").write_text(f"{SET}: smoke.yaml\n")
    port = _free_port()
    argv = [GAP, "online", "serve", "--port", str(port), "--capacity", "1"]
    argv += ["--runs-dir", str(home / "online_runs"), "--sets", str(home / "sets.yaml")]
    argv += ["--tokens", str(home / "tokens"), *options]
    with open(home / "online.log", "w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait(lambda: _get(url, ALICE, "/tasks")[0] == 200, "gap online serve", timeout=60)
            yield url
        finally:
            process.terminate()
            process.wait(timeout=60)
    # a stopped platform leaves no task server behind, one still starting included
    assert _task_servers(home / "online_runs") == []


def _task_servers(runs: Path) -> list[str]:
    """The command lines of live processes serving a task under `runs`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:  # it ended while we looked
            continue
        if any(str(runs).encode() in arg for arg in argv) and b"serve" in argv:
            found.append(b" ".join(argv).decode(errors="replace"))
    return found


def _gap_online(url: str, command: str, *args: str) -> subprocess.CompletedProcess:
    """`gap online COMMAND` as ALICE runs it."""
    argv = [GAP, "online", command, "--base-url", url, "--token", ALICE, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def _call(url: str, token: str, method: str, path: str, body: dict | None = None):
    """(status, decoded JSON body, headers) of one request; (None, None, {}) if unreachable."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url + path,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read()), dict(answer.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null"), dict(exc.headers)
    except OSError:
        return None, None, {}


def _get(url: str, token: str, path: str):
    return _call(url, token, "GET", path)


def _post(url: str, token: str, model: str):
    return _call(url, token, "POST", "/tasks", {"model_name": model, "benchmark_set": SET})


def _task(url: str, token: str, task_id: str) -> dict:
    status, task, _ = _get(url, token, f"/tasks/{task_id}")
    assert status == 200, (status, task)
    return task


def _raw(url: str, data: bytes, *, drip: bytes = b"", every_s: float = 0.5, timeout: float = 15):
    """Send `data` on a fresh connection, then `drip` a byte every `every_s` (a client that is
    never quite silent) until the server answers; read until it closes the connection.
    (status or None, body text, seconds until closed)."""
    port = int(url.rsplit(":", 1)[1])
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(data)
        answer, closed = b"", False
        for byte in drip:
            conn.settimeout(every_s)
            try:
                answer = conn.recv(65536)
                closed = not answer
                break  # the server answered, or closed the connection
            except TimeoutError:
                pass
            with contextlib.suppress(OSError):
                conn.sendall(bytes([byte]))
        conn.settimeout(timeout)
        with contextlib.suppress(ConnectionResetError):
            while not closed and (chunk := conn.recv(65536)):
                answer += chunk
    elapsed = time.monotonic() - start
    if not answer.startswith(b"HTTP/"):  # nothing, or an HTTP/0.9 answer (no status line)
        return None, answer.decode(errors="replace"), elapsed
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode(errors="replace"), elapsed


def _post_raw(headers: str, body: bytes = b"", token: str = ALICE) -> bytes:
    return (
        f"POST /tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n{headers}\r\n"
    ).encode() + body


def _one_line_error(body: str) -> str:
    error = json.loads(body)["error"]
    assert "\n" not in error
    return error


def _served(url: str) -> None:
    """The next honest client gets its answer."""
    status, tasks, _ = _get(url, ALICE, "/tasks")
    assert status == 200 and isinstance(tasks, list)


def test_an_owner_over_quota_and_a_full_queue_are_refused_while_another_owner_is_served(tmp_path):
    with _platform(tmp_path, "--max-tasks-per-owner", "2", "--max-queued", "2") as url:
        status, first, _ = _post(url, ALICE, "m1")
        assert status == 201
        assert _post(url, ALICE, "m2")[0] == 201
        _wait(lambda: _task(url, ALICE, first["task_id"])["state"] == "ready", "m1 ready")
        mine = {t["task_id"] for t in _get(url, ALICE, "/tasks")[1]}

        over = _gap_online(
            url, "submit", "--model-name", "m3", "--benchmark-set", SET, "--timeout", "1"
        )
        assert over.returncode == 2, over.stdout + over.stderr
        (line,) = over.stderr.strip().splitlines()
        assert "owner alice has 2 tasks queued or ready" in line
        assert "--max-tasks-per-owner (2)" in line and "(HTTP 429)" in line
        assert {t["task_id"] for t in _get(url, ALICE, "/tasks")[1]} == mine  # none added
        # a retry of a task it has is still answered: the quota counts tasks, not requests
        again = _post(url, ALICE, "m1")
        assert again[0] == 200 and again[1]["task_id"] == first["task_id"]

        status, theirs, _ = _post(url, BOB, "b1")  # another owner is served
        assert status == 201 and theirs["state"] == "queued"
        status, full, _ = _post(url, BOB, "b2")  # now 2 queued: m2 and b1
        assert status == 503
        assert "the platform's queue is full (2 tasks queued, --max-queued 2)" in (
            _one_line_error(json.dumps(full))
        )
        # only the one task that got a place has a run dir
        assert [p.name for p in (tmp_path / "online_runs").iterdir()] == [first["task_id"]]


def test_a_ready_task_nobody_attaches_to_expires_and_the_next_becomes_ready(tmp_path):
    with _platform(tmp_path, "--attach-timeout-s", "3") as url:
        first = _post(url, ALICE, "m1")[1]
        second = _post(url, ALICE, "m2")[1]
        ready = _wait(
            lambda: (t := _task(url, ALICE, first["task_id"]))["state"] == "ready" and t,
            "m1 ready",
        )
        assert _task(url, ALICE, second["task_id"])["state"] == "queued"  # capacity 1
        ended = _wait(
            lambda: (t := _task(url, ALICE, first["task_id"]))["state"] != "ready" and t,
            "m1 to end",
            timeout=60,
        )
        assert ended["state"] == "expired"
        assert (
            "no client attached within 3 s of it being ready (--attach-timeout-s)"
            in (ended["error"])
        )
        # its place was given back: the queued task got it, after the first ended
        became = _wait(
            lambda: (t := _task(url, ALICE, second["task_id"]))["ready_at"] and t,
            "m2 ready",
            timeout=120,
        )
        assert became["ready_at"] >= ended["finished_at"]
        # and the expired task's evaluation server is gone
        with pytest.raises(OSError):
            urllib.request.urlopen(ready["endpoint"] + "/healthz", timeout=5)


def test_a_ready_task_nobody_attaches_to_keeps_its_state_line_for_gap_online_ready(tmp_path):
    """What the user sees of an expired task: a state, and why, in one line."""
    with _platform(tmp_path, "--attach-timeout-s", "2") as url:
        task = _post(url, ALICE, "m1")[1]
        _wait(lambda: _task(url, ALICE, task["task_id"])["state"] == "expired", "m1 expired")
        shown = _gap_online(url, "ready", "--task-id", task["task_id"])
        assert shown.returncode == 1
        assert shown.stdout.strip().startswith(f"task {task['task_id']}: expired: no client")


def test_bodies_that_lie_about_their_size_or_never_arrive_are_refused(tmp_path):
    timeout = ["--request-timeout-s", str(REQUEST_TIMEOUT_S)]
    with _platform(tmp_path, *timeout) as url:
        honest = b'{"model_name": "m", "benchmark_set": "nope"}'
        cases = {
            # a negative size once had the handler read until the sender hung up
            "negative": (_post_raw("Content-Length: -1\r\n", honest), 400, "Content-Length '-1'"),
            "huge": (_post_raw("Content-Length: 99999999999\r\n"), 413, "at most 65536 bytes"),
            "missing": (_post_raw("", honest), 411, "Content-Length: required"),
            "not a number": (_post_raw("Content-Length: 1_0\r\n", honest), 400, "'1_0'"),
            "two sizes": (
                _post_raw("Content-Length: 2\r\nContent-Length: 40\r\n", honest),
                400,
                "give one size",
            ),
            "chunked": (
                _post_raw("Transfer-Encoding: chunked\r\n", b"2\r\n{}\r\n0\r\n\r\n"),
                411,
                "Transfer-Encoding: not taken",
            ),
            "bad json": (_post_raw("Content-Length: 5\r\n", b"{oops"), 400, "body: Invalid JSON"),
        }
        for name, (request, want, words) in cases.items():
            status, body, elapsed = _raw(url, request)
            assert status == want, (name, status, body)
            assert words in _one_line_error(body), (name, body)
            assert elapsed < REQUEST_TIMEOUT_S, name  # refused before waiting on the body
            _served(url)
        assert _get(url, ALICE, "/tasks")[1] == []  # none of them made a task


def test_a_slow_body_or_a_silent_client_times_out_without_holding_the_platform(tmp_path):
    with _platform(tmp_path, "--request-timeout-s", str(REQUEST_TIMEOUT_S)) as url:
        results: dict[str, tuple] = {}
        slow = _post_raw("Content-Length: 60\r\n", b'{"model_name": ')  # the rest never comes
        drip = b" " * 20  # 10 s of a byte every 0.5 s: never idle for a read timeout
        attacks = {
            "body": lambda: _raw(url, slow),
            "trickle": lambda: _raw(url, slow, drip=drip),
            "head": lambda: _raw(url, b"POST /tas"),
            "head trickle": lambda: _raw(url, b"POST /tasks HTTP/1.1\r\nX-A: ", drip=drip),
        }
        threads = [
            threading.Thread(target=lambda n=n, f=f: results.update({n: f()}))
            for n, f in attacks.items()
        ]
        for thread in threads:
            thread.start()
        time.sleep(0.3)
        _served(url)  # while they hang on, others are answered
        for thread in threads:
            thread.join(timeout=30)
        for name in ("body", "trickle"):
            status, body, elapsed = results[name]
            assert status == 408, (name, status, body)
            assert "body: not all 60 bytes arrived within 2 s" in _one_line_error(body)
            assert elapsed < REQUEST_TIMEOUT_S * 3, (name, elapsed)
        for name in ("head", "head trickle"):  # no whole head: closed, nothing to answer
            status, body, elapsed = results[name]
            assert status in (None, 400, 401, 411), (name, status, body)
            assert elapsed < REQUEST_TIMEOUT_S * 3, (name, elapsed)
        _served(url)
        assert _get(url, ALICE, "/tasks")[1] == []


def test_a_flood_of_idle_connections_is_turned_away_then_the_platform_serves_again(tmp_path):
    with _platform(tmp_path, "--request-timeout-s", "10") as url:
        port = int(url.rsplit(":", 1)[1])
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(64)]
        try:
            # once each has its thread and its slot, the next is turned away at once
            probe = b"GET /tasks HTTP/1.1\r\nHost: x\r\n\r\n"
            turned = _wait(lambda: (r := _raw(url, probe))[0] == 503 and r, "a 503", timeout=5)
            assert "serving its 64 connections" in _one_line_error(turned[1])
        finally:
            for conn in idle:
                conn.close()
        _wait(lambda: _get(url, ALICE, "/tasks")[0] == 200, "the platform to serve again", 30)


def test_task_lists_are_pages_and_a_strange_token_is_just_wrong(tmp_path):
    with _platform(tmp_path, "--max-queued", "4") as url:
        made = [_post(url, ALICE, f"m{i}")[1]["task_id"] for i in range(3)]
        status, page, headers = _get(url, ALICE, "/tasks?offset=1&limit=1")
        assert status == 200 and [t["task_id"] for t in page] == made[1:2]
        assert headers["X-Total-Count"] == "3"
        for query, words in (
            ("limit=0", "limit '0': give an integer from 1 to 200"),
            ("limit=100000", "limit '100000'"),
            ("offset=-1", "offset '-1'"),
            ("limit=abc", "limit 'abc'"),
        ):
            status, body, _ = _get(url, ALICE, f"/tasks?{query}")
            assert status == 400 and words in _one_line_error(json.dumps(body)), query
        # a token the header decodes to non-ASCII text: 401, not a dropped connection
        weird = "GET /tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer caf\u00e9\r\n\r\n"
        status, body, _ = _raw(url, weird.encode("latin-1"))
        assert status == 401 and "missing or wrong bearer token" in _one_line_error(body)
        _served(url)


def test_a_terminated_platform_takes_its_task_servers_with_it(tmp_path):
    """SIGTERM (a supervisor, `kill`) stops the platform as Ctrl-C does: no task server is
    left behind still holding its port and its owner's token."""
    with _platform(tmp_path) as url:
        task = _post(url, ALICE, "m1")[1]
        ready = _wait(
            lambda: (t := _task(url, ALICE, task["task_id"]))["state"] == "ready" and t,
            "m1 ready",
        )
        urllib.request.urlopen(ready["endpoint"] + "/healthz", timeout=5).close()
    # the platform process was terminated (SIGTERM) and waited for
    _wait(lambda: not _answers(ready["endpoint"] + "/healthz"), "the task server to stop", 30)


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).close()
    except OSError:
        return False
    return True
