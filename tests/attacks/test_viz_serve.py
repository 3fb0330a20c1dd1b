"""Attacks on `gap viz` through a run dir handed over by someone else: records whose trace,
video, frames or workflow point at an absolute path, climb out with `..`, or are symlinks to
files outside, and, for `gap viz --serve` (a real process on loopback), requests for files the
report does not link, directories, raw `..` paths and a foreign `Host`. Nothing outside the run
dir is read, linked or served, and the report's own files still are."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

from pytest_gap.viz.model import load_report
from tests.fake_session import BACKEND, FakeSession
from tests.test_service import _wait
from tests.test_viz import GAP

pytest_plugins = ["pytester"]

SECRET = "SECRET-MARKER-7f3a"  # in every file outside the run dir: found nowhere it is shown
CELL = "suites/fake_easy/task_00"
ABSOLUTE, CLIMBING, LINKED, HONEST = (f"{CELL}/seed_{s:03d}" for s in range(4))
PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 32


def _outside(home: Path) -> Path:
    """Files a crafted record points at: a trace (a node named after the secret, an image), a
    video and a text file, beside the output dir, not in the run dir."""
    outside = home / "outside"
    (outside / "trace" / "images").mkdir(parents=True)
    dag = {"workflow": SECRET, "nodes": [{"id": SECRET, "executions": [{"seq": 1}]}]}
    (outside / "trace" / "dag_trace.json").write_text(json.dumps(dag))
    (outside / "trace" / "images" / "001_secret.png").write_bytes(PNG + SECRET.encode())
    (outside / "video.mp4").write_text(SECRET)
    (outside / "secret.txt").write_text(SECRET)
    (outside / "agent_traces").mkdir()
    (outside / "agent_traces" / "agent.json").write_text(json.dumps({"prompt": SECRET}))
    return outside


def _rewrite(run_dir: Path, key: str, **fields) -> None:
    path = run_dir / key / "result.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, **fields}))


@pytest.fixture
def crafted(pytester) -> tuple[Path, Path, dict[Path, float]]:
    """(run dir, outside dir, mtimes of every file outside) of a real run on the fake backend
    (4 trials with video and frames), three of whose records were then crafted."""
    fake = FakeSession(pytester)
    trials = {"output_dir": "runs", "record_video": True, "frames_every": 2}
    suite = {"suite_name": "fake_easy", "task_ids": [0], "seeds": [0, 1, 2, 3]}
    fake.config(
        {
            "backend": BACKEND,
            "trials": trials,
            "suites": [{**suite, "workflow_dir": "wf"}],
            "gate_threshold": 0.0,
        }
    )
    assert fake.run_inprocess("bench.yaml").ret == 0
    run_dir = fake.run_dir()
    outside = _outside(fake.path)
    (run_dir / HONEST / "trace" / "images").mkdir()
    (run_dir / HONEST / "trace" / "images" / "001_idle.png").write_bytes(PNG)
    climb = Path(os.path.relpath(outside, run_dir))  # ../../outside
    _rewrite(
        run_dir,
        ABSOLUTE,
        trace=str(outside / "trace"),
        video=str(outside / "video.mp4"),
        frames="/etc/passwd",
        workflow=str(outside),
    )
    _rewrite(
        run_dir,
        CLIMBING,
        trace=f"{climb}/trace/dag_trace.json",
        video=f"{climb}/video.mp4",
        frames=f"{CELL}/../../../{climb}/secret.txt",
        workflow=str(climb),
    )
    # the records say nothing odd; the files they name are links out of the run dir
    linked = run_dir / LINKED
    for name, target in (("trace", outside / "trace"), ("video.mp4", outside / "video.mp4")):
        path = linked / name
        if path.is_dir():
            for sub in sorted(path.rglob("*"), reverse=True):
                sub.rmdir() if sub.is_dir() else sub.unlink()
            path.rmdir()
        else:
            path.unlink()
        path.symlink_to(target)
    mtimes = {p: p.stat().st_mtime for p in outside.rglob("*")}
    return run_dir, outside, mtimes


def _data(page: str) -> dict:
    return json.loads(re.search(r'type="application/json">(.*?)</script>', page)[1])


def _unchanged(outside: Path, mtimes: dict[Path, float]) -> None:
    assert {p: p.stat().st_mtime for p in outside.rglob("*")} == mtimes


def test_the_static_report_neither_reads_nor_links_a_path_outside_the_run_dir(crafted, tmp_path):
    run_dir, outside, mtimes = crafted
    for out in ([], ["--out", str(tmp_path / "elsewhere" / "r.html")]):
        done = subprocess.run(
            [GAP, "viz", str(run_dir), *out], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        page_path = Path(done.stdout.strip())
        page = page_path.read_text()
        assert SECRET not in page  # nothing of the files outside was read into it
        data = _data(page)
        trials = {t["key"]: t for t in data["trials"]}
        for key in (ABSOLUTE, CLIMBING, LINKED):
            for field in ("trace", "agent_traces", "video"):
                assert trials[key][field] is None, (key, field, trials[key][field])
            assert key not in data["traces"]
        assert trials[ABSOLUTE]["frames"] is None and trials[CLIMBING]["frames"] is None
        # every link left resolves inside the run dir; the honest trial keeps all of its own
        for trial in data["trials"]:
            for field in ("video", "frames", "trace"):
                if trial[field]:
                    target = (page_path.parent / trial[field]).resolve()
                    assert target.is_relative_to(run_dir.resolve()), (trial["key"], field)
        assert all(trials[HONEST][f] for f in ("video", "frames", "trace"))
        assert HONEST in data["traces"]
        # each refused path is one warning line naming the record, the field and the path
        warned = [x for x in done.stderr.splitlines() if "not a path inside the run dir" in x]
        assert any(f"{ABSOLUTE}/result.json: trace '{outside}/trace'" in x for x in warned)
        assert any(f"{CLIMBING}/result.json: video '../" in x for x in warned)
        assert any("frames '/etc/passwd'" in x for x in warned)
    _unchanged(outside, mtimes)


@contextlib.contextmanager
def _serve(run_dir: Path):
    """A real `gap viz RUN --serve` process; yields its port."""
    with subprocess.Popen(
        [GAP, "viz", str(run_dir), "--serve"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as process:
        try:
            lines = iter(process.stdout.readline, "")
            line = next((x for x in lines if x.startswith("gap viz: serving")), "")
            match = re.search(r"at http://127\.0\.0\.1:(\d+)/", line)
            assert match, line
            yield int(match[1])
        finally:
            process.terminate()
            process.wait(timeout=30)


def _get(port: int, target: str, host: str | None = "default") -> tuple[int, bytes]:
    """One raw request (the target exactly as written: no client-side `..` folding)."""
    host = f"127.0.0.1:{port}" if host == "default" else host
    head = f"GET {target} HTTP/1.1\r\n" + (f"Host: {host}\r\n" if host is not None else "")
    with socket.create_connection(("127.0.0.1", port), timeout=15) as conn:
        conn.sendall((head + "Connection: close\r\n\r\n").encode())
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def test_the_server_hands_out_only_what_the_report_links(crafted):
    run_dir, outside, mtimes = crafted
    with _serve(run_dir) as port:
        status, page = _get(port, "/")
        assert status == 200 and SECRET.encode() not in page
        data = _data(page.decode())
        honest = next(t for t in data["trials"] if t["key"] == HONEST)
        # what the page links is served: the video, the frame strip, a trace and its image
        for link in (honest["video"], honest["frames"]):
            status, body = _get(port, "/" + link)
            assert status == 200 and body == (run_dir / link).read_bytes()
        status, trace = _get(port, f"/api/trace?key={HONEST}")
        assert status == 200
        (image,) = [i for n in json.loads(trace)["nodes"] for r in n["runs"] for i in r["images"]]
        assert _get(port, "/" + image) == (200, PNG)

        secret_path = outside / "secret.txt"
        climb = os.path.relpath(secret_path, run_dir)
        refused = [
            f"/api/trace?key={ABSOLUTE}",
            f"/api/trace?key={CLIMBING}",
            f"/api/trace?key={LINKED}",
            f"/{LINKED}/video.mp4",  # a link out of the run dir
            f"/{LINKED}/trace/dag_trace.json",
            f"/{HONEST}/result.json",  # in the run dir, but the page does not link it
            "/summary.json",
            f"/{HONEST}/trace/dag_trace.json",
            f"/{HONEST}/trace/nodes/001_idle.json",
            "/suites/",  # directories: no listing
            f"/{CELL}/",
            f"/{HONEST}",
            f"/{climb}",  # raw `..` request lines
            "/../../../../../../etc/passwd",
            "/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
            f"/{HONEST}/../../../../../{climb}",
            "/" + str(secret_path),  # //abs/path
            str(secret_path),
            "/etc/passwd",
        ]
        for target in refused:
            status, body = _get(port, target)
            assert status == 404, (target, status, body[:200])
            assert SECRET.encode() not in body and b"Directory listing" not in body, target
            (line,) = body.decode().strip().splitlines()
            assert "not a file this report links" in line or "no trace for trial" in line
        # a page on another name (DNS rebinding) or a request with no name gets nothing
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.1", None):
            status, body = _get(port, "/", host=host)
            assert status == 403 and b"is not this server" in body, host
            assert SECRET.encode() not in body and b"gap-data" not in body
        status, page = _get(port, "/", host=f"localhost:{port}")
        assert status == 200 and b"gap-data" in page  # the next honest client is served
    _unchanged(outside, mtimes)


def test_a_link_swapped_in_after_the_server_started_is_not_followed(crafted):
    run_dir, outside, mtimes = crafted
    with _serve(run_dir) as port:
        video = run_dir / HONEST / "video.mp4"
        assert _get(port, f"/{HONEST}/video.mp4")[0] == 200
        video.unlink()
        video.symlink_to(outside / "secret.txt")
        status, body = _get(port, f"/{HONEST}/video.mp4")
        assert status == 404 and SECRET.encode() not in body
        _wait(lambda: _get(port, "/")[0] == 200, "the page", timeout=10)
    _unchanged(outside, mtimes)


def test_files_of_the_wrong_kind_or_shape_neither_hang_nor_break_the_report(crafted):
    """A FIFO where summary.json or a trace should be (reading it would block for ever) and a
    trace whose fields have the wrong types: the report opens without them, the server too."""
    run_dir, outside, mtimes = crafted
    (run_dir / "summary.json").unlink()
    os.mkfifo(run_dir / "summary.json")
    _rewrite(run_dir, ABSOLUTE, trace=None, video=None, frames=None, workflow=None)
    (run_dir / ABSOLUTE / "trace" / "dag_trace.json").unlink()
    os.mkfifo(run_dir / ABSOLUTE / "trace" / "dag_trace.json")
    dag = run_dir / HONEST / "trace" / "dag_trace.json"
    broken = {**json.loads(dag.read_text()), "edges": [{"source": "a", "taken": "many"}]}
    dag.write_text(json.dumps(broken))
    done = subprocess.run([GAP, "viz", str(run_dir)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    data = _data(Path(done.stdout.strip()).read_text())
    assert len(data["trials"]) == 4 and data["cells"]  # counted from the records instead
    assert HONEST not in data["traces"] and ABSOLUTE not in data["traces"]
    assert any("not a trace this harness wrote" in x for x in done.stderr.splitlines())
    with _serve(run_dir) as port:
        for key in (HONEST, ABSOLUTE):
            assert _get(port, f"/api/trace?key={key}")[0] == 404
        assert _get(port, "/")[0] == 200
    _unchanged(outside, mtimes)


def test_a_summary_cell_of_the_wrong_shape_is_left_out_with_a_warning(crafted, caplog):
    run_dir, _, _ = crafted
    summary = json.loads((run_dir / "summary.json").read_text())
    bad = {**summary["cells"][0], "key": "bad", "tasks": [{"task_id": 0, "n_success": "all"}]}
    summary["cells"].append(bad)
    (run_dir / "summary.json").write_text(json.dumps(summary))
    report = load_report(run_dir, run_dir, inline_budget=0)
    assert [c.key for c in report.cells] == [summary["cells"][0]["key"]]
    assert any("a cell it cannot show" in r.message for r in caplog.records)


def _stream(port: int, target: str, after_head=None) -> tuple[int, int, int, bytes]:
    """(status, Content-Length, body bytes received until the server closed, the body's first
    200 bytes) of one request, counting the body rather than keeping it; `after_head()` runs
    once the head is in, before the body is read on."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        answer = b""
        while b"\r\n\r\n" not in answer and (chunk := conn.recv(65536)):
            answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        if after_head is not None:
            after_head()
        received, first = len(body), body[:200]
        while chunk := conn.recv(1 << 20):
            received += len(chunk)
            first = (first + chunk)[:200]
    lines = head.decode().split("\r\n")
    length = next(int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length"))
    return int(lines[0].split()[1]), length, received, first


def test_a_file_over_the_bound_is_refused_from_its_size_and_a_growing_one_is_cut(crafted):
    """A video past MAX_SERVED_BYTES (a sparse file: its size costs no disk), directly or through
    a link inside the run dir, is refused in one line from its size; one of exactly the bound
    is served whole; one that grows while it is served goes out at the size it had."""
    from pytest_gap.viz.serve import MAX_SERVED_BYTES

    run_dir, outside, mtimes = crafted
    with _serve(run_dir) as port:
        page = _data(_get(port, "/")[1].decode())
        honest = next(t for t in page["trials"] if t["key"] == HONEST)
        video, frames = run_dir / honest["video"], run_dir / honest["frames"]
        os.truncate(video, 0)
        os.truncate(video, MAX_SERVED_BYTES + 1)
        big = run_dir / "big.bin"  # in the run dir, but the page links it only through a link
        big.touch()
        os.truncate(big, 3 * MAX_SERVED_BYTES)
        frames.unlink()
        frames.symlink_to(big)
        for link in (honest["video"], honest["frames"]):
            status, length, received, body = _stream(port, "/" + link)
            assert status == 403, (link, status)
            (line,) = body.decode().strip().splitlines()
            assert f"hands out files of at most {MAX_SERVED_BYTES >> 20} MiB" in line, line
            assert "MAX_SERVED_BYTES" in line and received == length < 1000
        os.truncate(video, MAX_SERVED_BYTES)  # the bound itself is served, whole
        assert _stream(port, "/" + honest["video"])[:3] == (200, *(2 * [MAX_SERVED_BYTES]))

        # larger than any socket buffer: the server is still reading it when it grows
        os.truncate(video, 32 << 20)
        grow = lambda: os.truncate(video, MAX_SERVED_BYTES + (64 << 20))  # noqa: E731
        status, length, received, _ = _stream(port, "/" + honest["video"], after_head=grow)
        assert (status, length, received) == (200, 32 << 20, 32 << 20)
        assert _get(port, "/")[0] == 200  # and the next client is served
    _unchanged(outside, mtimes)
