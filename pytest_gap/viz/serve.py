"""`gap viz RUN_DIR --serve`: the report on loopback for runs too big to inline. The page is
built without traces; each trial's trace and per-step evidence are read when its page asks
(`api/trace?key=`, `api/steps?key=`), and videos, frame strips and perception images are served
from the run dir as files.

What it serves is an allow-list built from the run's records when it starts: the page, the trace
and steps endpoints, and the files the page links (each trial's video and frame strip, its
trace's images), each confined to the run dir. Anything else (a directory, result.json, a `..`
path, a symlink out of the run dir) answers 404: a run dir may hold prompts, configs and traces
not meant to leave, and a page on another site must not read them through the user's browser, so
a `Host` other than this server's own names is refused too (DNS rebinding).

A file is served only if it is a regular file of at most MAX_SERVED_BYTES when it is opened
(its size read from the open file, never by reading it: 403 and one line beyond), and exactly
that many bytes go out: a file that grows while it is served is cut at the size it had, one
that shrinks ends the connection early. The open file is checked to lie in the run dir, so a
link swapped in between the check and the open is not followed either.
"""

from __future__ import annotations

import contextlib
import logging
import mimetypes
import os
import stat
import sys
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from pytest_gap.errors import shown
from pytest_gap.viz.files import MAX_READ_BYTES, relative
from pytest_gap.viz.html import compare_json, render
from pytest_gap.viz.model import Report, load_report
from pytest_gap.viz.steps import steps_view
from pytest_gap.viz.trace import read_trace, trace_images

HOST = "127.0.0.1"  # loopback only: a run dir may hold prompts and traces not meant to leave
PAGE_PATHS = frozenset({"/", "/index.html", "/report.html"})
TRACE_PATH = "/api/trace"
STEPS_PATH = "/api/steps"  # a trial's per-step evidence (viz/steps.py), read when asked
REQUEST_TIMEOUT_S = 30.0  # a connection that sends nothing does not hold a thread for ever
MAX_SERVED_BYTES = MAX_READ_BYTES  # one video, frame strip or image (docs/security.md: 64 MiB)
CHUNK_BYTES = 1 << 20  # what one write of a served file holds in memory
log = logging.getLogger(__name__)


def linked_files(report: Report, root: Path) -> dict[str, Path]:
    """URL path -> file, for every file the page links: each trial's video and frame strip and
    the perception images of its trace. The report's paths are already confined to `root`
    (files.confined); this is the whole of what the server hands out besides the page."""
    files: dict[str, Path] = {}
    for trial in report.trials:
        for link in (trial.video, trial.frames):
            if link:
                files["/" + link] = root / link
        if trial.trace:
            for paths in trace_images(root / trial.trace).values():
                for path in paths:
                    files["/" + (relative(path, root) or "")] = path
    return files


class _Handler(BaseHTTPRequestHandler):
    report: Report
    page: bytes
    root: Path
    files: dict[str, Path]
    hosts: frozenset[str]  # the Host values that name this server
    timeout = REQUEST_TIMEOUT_S

    def do_GET(self) -> None:
        host = self.headers.get("Host", "")
        if host not in self.hosts:
            mine = sorted(self.hosts)[0]
            return self._refuse(
                HTTPStatus.FORBIDDEN,
                f"Host {host!r} is not this server; open http://{mine}/ (gap viz answers only "
                "its own loopback names)",
            )
        url = urlsplit(self.path)
        path = unquote(url.path)
        if path in PAGE_PATHS:
            return self._send(self.page, "text/html; charset=utf-8")
        if path == TRACE_PATH:
            return self._trace(parse_qs(url.query).get("key", [""])[0])
        if path == STEPS_PATH:
            return self._steps(parse_qs(url.query).get("key", [""])[0])
        return self._file(path)

    def _steps(self, key: str) -> None:
        trial = next((t for t in self.report.trials if t.key == key), None)
        found = trial.steps_file if trial else None  # only a trial of this run: no path tricks
        steps = steps_view(self.root / found) if found else None
        if steps is None:
            return self._refuse(HTTPStatus.NOT_FOUND, f"no step evidence for trial {key!r}")
        self._send(steps.model_dump_json().encode(), "application/json")

    def _trace(self, key: str) -> None:
        trial = next((t for t in self.report.trials if t.key == key), None)
        found = trial.trace if trial else None  # only a trial of this run: no path tricks
        trace = read_trace(self.root / found, self.root) if found else None
        if trace is None:
            return self._refuse(HTTPStatus.NOT_FOUND, f"no trace for trial {key!r}")
        self._send(trace.model_dump_json().encode(), "application/json")

    def _file(self, path: str) -> None:
        file = self.files.get(path)
        opened = _open_inside(file, self.root) if file is not None else None
        if opened is None:
            return self._refuse(
                HTTPStatus.NOT_FOUND,
                f"{path[:200]!r} is not a file this report links (gap viz serves the page and "
                "its videos, frame strips and images only)",
            )
        fd, size = opened
        with open(fd, "rb") as source:
            if size > MAX_SERVED_BYTES:
                return self._refuse(
                    HTTPStatus.FORBIDDEN,
                    f"{path[:200]!r} is {size} bytes; gap viz --serve hands out files of at most "
                    f"{MAX_SERVED_BYTES >> 20} MiB (MAX_SERVED_BYTES): open it from the run dir",
                )
            kind = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
            self._head(HTTPStatus.OK, kind, size)
            with contextlib.suppress(ConnectionError):  # a video the browser stopped loading
                _copy(source, self.wfile, size)

    def _head(self, status: HTTPStatus, kind: str, size: int) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(size))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()

    def _send(self, body: bytes, kind: str) -> None:
        self._head(HTTPStatus.OK, kind, len(body))
        self.wfile.write(body)

    def _refuse(self, status: HTTPStatus, line: str) -> None:
        body = (line.replace("\n", " ") + "\n").encode()
        self._head(status, "text/plain; charset=utf-8", len(body))
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        pass  # one line per video request drowns the URL the user needs


def _open_inside(file: Path, root: Path) -> tuple[int, int] | None:
    """(descriptor, size) of `file` opened for reading, when it is a regular file in `root`
    (symlinks followed) at the moment it is open; None otherwise. The size comes from the open
    file: a FIFO, device or directory is never read, and neither is a file to learn its size."""
    try:
        target = file.resolve(strict=True)
    except (OSError, RuntimeError, ValueError):  # gone, a symlink loop, a NUL byte
        return None
    if not target.is_relative_to(root):
        return None
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO opens, unread
    try:
        fd = os.open(target, flags)
    except OSError:  # a link swapped in since the resolve, or unreadable
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or not _opened_inside(fd, root):
        os.close(fd)
        return None
    return fd, info.st_size


def _opened_inside(fd: int, root: Path) -> bool:
    """Whether the file open as `fd` lies in `root`: a parent directory swapped for a link
    between the resolve and the open is caught here (Linux names an open file in /proc)."""
    try:
        where = Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:  # no /proc: the resolve's answer stands
        return True
    return where.is_relative_to(root)


def _copy(source, out, size: int) -> None:
    """Exactly `size` bytes of `source` to `out`, a chunk at a time (fewer if it shrank)."""
    left = size
    while left > 0:
        chunk = source.read(min(CHUNK_BYTES, left))
        if not chunk:
            return
        out.write(chunk)
        left -= len(chunk)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        """One line in the log, escaped: the traceback http.server prints may quote a request."""
        exc = sys.exception()
        if isinstance(exc, ConnectionError):  # a browser that stopped loading a video
            return
        why = f"{type(exc).__name__}: {shown(exc)}"
        log.warning("gap viz: a request from %s failed: %s", client_address[0], why)


def make_server(run_dir: Path, port: int = 0, against: Path | None = None) -> ThreadingHTTPServer:
    """A server for `run_dir` on loopback (port 0: any free port); call serve_forever()."""
    root = run_dir.resolve()
    report = load_report(root, root, inline_budget=0, serve=True)
    if against is not None:
        report.compare = compare_json(against, run_dir)
    server = _Server((HOST, port), _Handler)
    bound = server.server_address[1]
    server.RequestHandlerClass = type(
        "GapVizHandler",
        (_Handler,),
        {
            "report": report,
            "page": render(report).encode(),
            "root": root,
            "files": linked_files(report, root),
            "hosts": frozenset({f"{HOST}:{bound}", f"localhost:{bound}"}),
        },
    )
    return server


__all__ = ["make_server"]
