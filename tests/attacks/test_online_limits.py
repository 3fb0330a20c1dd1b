"""Attacks on `gap online serve`'s limits, against a real platform process on loopback: an owner
past its quota, a full queue, a ready task nobody attaches to, HTTP requests that lie about
their bodies or never finish them, and connections without a token held open or reopened to
crowd out those with one. Each is refused in one line (or its connection closed) and the next
honest client is served. No episode runs: a task is ready once its evaluation server is up and
the set submitted, which needs no simulator.

No test here rests on a wall-clock window a loaded machine could miss: a refusal that must come
before a timeout is asked of a platform whose timeout is far off (LONG_TIMEOUT_S), so getting the
answer at all proves it; a timeout that must cut a client is seen cutting one that would
otherwise go on for minutes; states are waited for with generous ceilings, never raced."""

from __future__ import annotations

import contextlib
import json
import select
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.test_service import GAP, _config, _free_port, _wait

ALICE, BOB = "alice-token-0123456789", "bob-token-9876543210"
SET = "libero_smoke"
CUT_S = 3.0  # --request-timeout-s where a test watches the timeout cut a client off
LONG_TIMEOUT_S = 600.0  # --request-timeout-s where a test must see an answer long before it
MAX_CONNECTIONS = 64  # the platform's max_connections (service.platform.Limits' default)


@contextlib.contextmanager
def _platform(home: Path, *options: str, started: list | None = None):
    """A `gap online serve` process (capacity 1) with `options`; yields its URL (the process
    is appended to `started`)."""
    (home / "tokens").write_text(f"{ALICE} alice\n{BOB} bob\n")
    _config(home / "smoke.yaml", tasks=(0,))
    (home / "sets.yaml").write_text(f"{SET}: smoke.yaml\n")
    port = _free_port()
    argv = [GAP, "online", "serve", "--port", str(port), "--capacity", "1"]
    argv += ["--runs-dir", str(home / "online_runs"), "--sets", str(home / "sets.yaml")]
    argv += ["--tokens", str(home / "tokens"), *options]
    with open(home / "online.log", "w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        if started is not None:
            started.append(process)
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


def _call(url: str, token: str, method: str, path: str, body: dict | None = None, headers=None):
    """(status, decoded JSON body, headers) of one request; (None, None, {}) if unreachable."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url + path,
        data=data,
        method=method,
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            **(headers or {}),
        },
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


def _raw(url: str, data: bytes, *, drip: bytes = b"", every_s: float = 0.1, timeout: float = 60):
    """Send `data` on a fresh connection, then `drip` a byte every `every_s` (a client that is
    never quite silent) until the server answers; read until it closes the connection.
    (status or None, body text, whether the server answered or closed while `drip` lasted)."""
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(data)
        answer, closed, cut = b"", False, False
        for byte in drip:
            conn.settimeout(every_s)
            try:
                answer = conn.recv(65536)
                closed, cut = not answer, True
                break  # the server answered, or closed the connection
            except TimeoutError:
                pass
            except ConnectionResetError:  # closed on bytes it had not read
                closed, cut = True, True
                break
            with contextlib.suppress(OSError):
                conn.sendall(bytes([byte]))
        conn.settimeout(timeout)
        with contextlib.suppress(ConnectionResetError):
            while not closed and (chunk := conn.recv(65536)):
                answer += chunk
    if not answer.startswith(b"HTTP/"):  # nothing, or an HTTP/0.9 answer (no status line)
        return None, answer.decode(errors="replace"), cut
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode(errors="replace"), cut


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
        # ready_at stays once set: a poll that comes after the 3 s have passed still sees it
        ready = _wait(lambda: (t := _task(url, ALICE, first["task_id"]))["ready_at"] and t, "m1")
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
        # its place was given back (capacity 1): the queued task got it, after the first ended
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
    # the platform's own timeout is LONG_TIMEOUT_S and _raw's 60 s: a refusal that waited on
    # a body (which never comes) would not arrive at all, so each answer proves it did not
    with _platform(tmp_path, "--request-timeout-s", str(LONG_TIMEOUT_S)) as url:
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
            status, body, _ = _raw(url, request)
            assert status == want, (name, status, body)
            assert words in _one_line_error(body), (name, body)
            _served(url)
        assert _get(url, ALICE, "/tasks")[1] == []  # none of them made a task


def test_a_slow_body_or_a_silent_client_times_out_without_holding_the_platform(tmp_path):
    with _platform(tmp_path, "--request-timeout-s", str(CUT_S)) as url:
        results: dict[str, tuple] = {}
        slow = _post_raw("Content-Length: 60\r\n", b'{"model_name": ')  # the rest never comes
        # a byte every 0.1 s for up to 2 minutes: never idle long enough for a read timeout,
        # and far longer than the request may take, so only the request's deadline answers it
        drip = b" " * 1200
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
        _served(url)  # while they hang on, others are answered
        for thread in threads:
            thread.join(timeout=300)
        for name in ("body", "trickle"):
            status, body, _ = results[name]
            assert status == 408, (name, status, body)
            assert f"body: not all 60 bytes arrived within {CUT_S:g} s" in _one_line_error(body)
        for name in ("head", "head trickle"):  # no whole head: 408, or closed
            status, body, _ = results[name]
            assert status in (None, 400, 401, 408, 411), (name, status, body)
        for name in ("trickle", "head trickle"):  # cut by the deadline, not by its own end
            assert results[name][2], name
        _served(url)
        assert _get(url, ALICE, "/tasks")[1] == []


def _closed_one(conns: list[socket.socket]) -> bool:
    """Whether the platform closed one of `conns` (idle ones it would otherwise keep until its
    timeout): it does once as many are open as it waits for."""
    readable, _, _ = select.select(conns, [], [], 0)
    return bool(readable)


def _threads(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(x for x in status.splitlines() if x.startswith("Threads:")).split()[1])


def test_connections_without_a_token_never_starve_a_client_with_one(tmp_path):
    """More connections than the platform waits for, held open without a word or with half a
    head, each opened again a moment after the platform closes it (the attack: a client that
    keeps reconnecting): a client with its token is answered every time, and the platform's
    threads stay bounded. Before, the first 64 took every slot until their timeout and everyone
    else got 503."""
    from pytest_gap.service.http_gate import WAITING_PER_SLOT

    started: list[subprocess.Popen] = []
    with _platform(tmp_path, "--request-timeout-s", str(LONG_TIMEOUT_S), started=started) as url:
        port = int(url.rsplit(":", 1)[1])
        openers = [b"", b"GET /tasks HTTP/1.1\r\nHost: x\r\nX-A: "]

        def connect(i: int) -> socket.socket:
            conn = socket.create_connection(("127.0.0.1", port), timeout=30)
            conn.sendall(openers[i % 2])
            return conn

        conns = [connect(i) for i in range((WAITING_PER_SLOT + 1) * MAX_CONNECTIONS)]
        stop, reopened, peak = threading.Event(), [0], [0]

        def reconnect() -> None:
            while not stop.wait(0.5):  # the closed ones, reopened twice a second
                readable, _, _ = select.select(conns, [], [], 0)
                for conn in readable:
                    i = conns.index(conn)
                    conn.close()
                    conns[i] = connect(i)
                    reopened[0] += 1
                peak[0] = max(peak[0], _threads(started[0].pid))

        attacker = threading.Thread(target=reconnect)
        try:
            _wait(lambda: _closed_one(conns), "the platform to close one", timeout=120)
            attacker.start()
            for _ in range(5):
                _wait(lambda: reopened[0] > 0, "the attacker to reconnect", timeout=120)
                reopened[0] = 0
                status, tasks, _ = _get(url, ALICE, "/tasks")
                assert status == 200 and tasks == [], (status, tasks)
            status, task, _ = _post(url, BOB, "b1")
            assert status == 201, (status, task)
        finally:
            stop.set()
            if attacker.is_alive():
                attacker.join(timeout=60)
            for conn in conns:
                conn.close()
        # the loop, a thread (and its deadline's timer) per request served: no thread waits
        # for a head
        assert peak[0] <= 2 * MAX_CONNECTIONS + 16, peak[0]
        _served(url)


def test_requests_with_a_token_that_hold_every_slot_are_turned_away_beyond_it(tmp_path):
    """64 requests with a good token whose bodies never come hold every serving slot: the next
    one is answered 503 naming the bound at once; once they go, the platform serves again."""
    with _platform(tmp_path, "--request-timeout-s", str(LONG_TIMEOUT_S)) as url:
        port = int(url.rsplit(":", 1)[1])
        slow = _post_raw("Content-Length: 60\r\n", b'{"model_name": ')
        held = []
        try:
            for _ in range(MAX_CONNECTIONS):
                held.append(socket.create_connection(("127.0.0.1", port), timeout=30))
                held[-1].sendall(slow)
            probe = _post_raw("Content-Length: 2\r\n", b"{}")
            turned = _wait(lambda: (r := _raw(url, probe))[0] == 503 and r, "a 503", timeout=120)
            error = _one_line_error(turned[1])
            assert f"serving its {MAX_CONNECTIONS} connections (max_connections)" in error
        finally:
            for conn in held:
                conn.close()
        _wait(lambda: _get(url, ALICE, "/tasks")[0] == 200, "the platform to serve again", 120)
        assert _get(url, ALICE, "/tasks")[1] == []


def test_a_browsers_request_is_refused_even_with_a_good_token(tmp_path):
    """A page the operator has open must not drive the platform (docs/security.md: every door
    refuses a browser): Origin or Sec-Fetch-Site, on a read or a create, is 403 in one line."""
    with _platform(tmp_path) as url:
        marks = [
            {"Origin": "https://evil.example"},
            {"Origin": "null"},
            {"Sec-Fetch-Site": "cross-site"},
            {"Sec-Fetch-Site": "same-origin"},  # a page of the platform's own origin, too
        ]
        body = {"model_name": "m", "benchmark_set": SET}
        for headers in marks:
            for method, path, sent in (("GET", "/tasks", None), ("POST", "/tasks", body)):
                status, answer, _ = _call(url, ALICE, method, path, sent, headers)
                assert status == 403, (headers, method, status, answer)
                (name,) = headers
                assert f"refused a browser's request ({name}: " in answer["error"], answer
                assert "\n" not in answer["error"]
        assert _get(url, ALICE, "/tasks")[1] == []  # no POST made a task
        _served(url)


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
