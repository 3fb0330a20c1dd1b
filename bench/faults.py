"""A fault-injection campaign on real runs: what the harness records, and that no trial is lost.

    python bench/faults.py [--short] [--only NAME[,NAME]] [--keep DIR]

Every fault is injected into a real pytest session over real LIBERO (libero_object task 0,
short episodes: `trials.max_steps` 20-30, a few seeds) in a scratch dir of its own. Trials run
a tiny workflow (`dawdle`: a few zero-motion steps with short sleeps, from the scratch dir's
conftest.py), `policy_only` against the built-in `hold` policy (managed) or a tiny websocket
server in this script, or `llm_generation` against a tiny OpenAI-shaped HTTP server in this
script. For each fault it prints one row:

    fault | what the harness recorded | finished before | after | lost | recover s

- finished: trials with a valid result.json that is not errored (an infrastructure failure is
  errored: it is re-run by --gap-resume, so it does not count as finished).
- before: finished trials at the moment of the fault (after the damage, for damaged files).
- after: finished trials at the end, after the documented recovery step (`--gap-resume` where
  the row says so).
- lost: trials finished before the fault that are gone or changed after, plus planned trials
  not finished at the end. It must be 0.
- recover s: wall time from the fault to the last trial recorded (the recovery step included).

Exit status 1 if any row lost a trial or its recovery did not finish (or a row's expectation,
e.g. "the run goes on", did not hold); 0 otherwise. `--short` runs the subset the tests run
(about a minute and a half on 2 cores); `--only` picks rows by name.

A managed policy server killed mid-run is restarted by the session, which re-runs the trials
the death broke: the row demands that the first session finishes every trial by itself
(`MANAGED_KILL_RECOVERY = "none"`; "resume" accepts infrastructure failures that
`--gap-resume` re-runs, as before servers were supervised).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_gap.config import load_config  # noqa: E402
from pytest_gap.plan import plan  # noqa: E402
from pytest_gap.policies.wire import packb  # noqa: E402
from pytest_gap.results import TrialResult, read_result  # noqa: E402

GAP = str(Path(sys.executable).with_name("gap"))
SESSION_TIMEOUT = 300  # a session that takes longer than this is stuck: the row fails
# How the managed-server-kill row recovers: "none" (supervised restarts: the session restarts
# the server and re-runs the broken trials itself) or "resume" (before supervision: infra
# failures, an errored cell, `--gap-resume` re-runs them).
MANAGED_KILL_RECOVERY = "none"

# Skills of the scratch sessions, registered by their conftest.py.
CONFTEST = '''
import ctypes
import os
import time

from pydantic import BaseModel

from pytest_gap.skills.context import SkillContext
from pytest_gap.skills.registry import skill


class Dawdled(BaseModel):
    steps: int


@skill(scene=False)
def dawdle(ctx: SkillContext, steps: int = 4, pause_s: float = 0.4) -> Dawdled:
    """Zero-motion steps with a pause after each: a trial that takes a known while."""
    for _ in range(steps):
        ctx.act([0.0] * 6 + [-1.0])
        time.sleep(pause_s)
    return Dawdled(steps=steps)


@skill(scene=False)
def native_hang(ctx: SkillContext) -> Dawdled:
    """Once per marker file ($GAP_FAULTS_HANG): block forever in C where no signal reaches
    (glibc's pthread_mutex_lock relocking a normal mutex it holds never returns, no EINTR)."""
    marker = os.environ.get("GAP_FAULTS_HANG", "")
    try:
        os.unlink(marker)
    except OSError:
        return Dawdled(steps=0)  # already hung once: this run goes through
    with open(marker + ".at", "w") as out:
        out.write(str(time.time()))
    libc = ctypes.CDLL(None)
    mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER on glibc
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)
    return Dawdled(steps=0)
'''


def _graph(nodes: dict, start: str) -> dict:
    return {"version": 1, "name": "faults", "start": start, "nodes": nodes}


FAILED_END = {"failed": {"type": "end", "status": "failure"}}
DAWDLE = _graph(
    {"dawdle": {"type": "tool", "skill": "dawdle", "next": "failed"}, **FAILED_END}, "dawdle"
)
QUICK = _graph(
    {
        "dawdle": {"type": "tool", "skill": "dawdle", "inputs": {"pause_s": 0}, "next": "failed"},
        **FAILED_END,
    },
    "dawdle",
)
STUCK = _graph(
    {
        "hang": {"type": "tool", "skill": "native_hang", "next": "dawdle"},
        "dawdle": {"type": "tool", "skill": "dawdle", "next": "failed"},
        **FAILED_END,
    },
    "hang",
)


# -- a scratch session -----------------------------------------------------------------------------
class Lab:
    """A scratch dir with the conftest, the workflows and one config; runs pytest sessions."""

    def __init__(self, root: Path, name: str):
        self.dir = root / name
        self.dir.mkdir(parents=True)
        (self.dir / "pytest.ini").write_text("[pytest]\n")
        (self.dir / "conftest.py").write_text(CONFTEST)
        for wf, graph in (("wf", DAWDLE), ("quick", QUICK), ("stuck", STUCK)):
            (self.dir / wf).mkdir()
            (self.dir / wf / "workflow.json").write_text(json.dumps(graph))
        self.output = self.dir / "runs"
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(self.dir)])}
        self.env.pop("PYTEST_ADDOPTS", None)
        self.log = self.dir / "sessions.log"

    def grid(self, mode: str = "workflow", seeds: int = 4, *, max_steps: int = 20, **extra):
        """libero_object task 0 x `seeds` seeds in one cell of `mode` (gate threshold 0)."""
        trials = {"max_steps": max_steps, **extra.pop("trials", {})}
        block = {
            "families": ["libero"],
            "variations": ["object"],
            "modes": [mode],
            "task_ids": [0],
            "n_seeds": seeds,
            "gate_threshold": 0.0,
            "output_dir": extra.pop("output_dir", "runs"),
            "mode_overrides": extra.pop("overrides", {"workflow": {"workflow_dir": "wf"}}),
            **extra.pop("block", {}),
        }
        data = {"trials": trials, "benchmark": block, **extra}
        (self.dir / "grid.yaml").write_text(yaml.safe_dump(data))
        self.output = self.dir / block["output_dir"]
        cells = plan(load_config(self.dir / "grid.yaml"))
        self.planned = {t.key for c in cells for t in c.trials()}

    def start(self, *args: str, env: dict | None = None) -> subprocess.Popen:
        command = [sys.executable, "-m", "pytest", "grid.yaml", "-p", "no:cacheprovider", *args]
        out = self.log.open("a")
        out.write(f"\n$ {' '.join(command)}\n")
        out.flush()
        return subprocess.Popen(
            command,
            cwd=self.dir,
            env={**self.env, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the session kill takes it all
        )

    def run(self, *args: str, env: dict | None = None) -> int:
        return wait(self.start(*args, env=env))

    def run_dir(self) -> Path | None:
        dirs = sorted(p for p in self.output.glob("2*") if p.is_dir())
        return dirs[-1] if dirs else None

    def records(self) -> dict[str, TrialResult]:
        run_dir = self.run_dir()
        found = {}
        for key in sorted(self.planned) if run_dir else ():
            result = read_result(run_dir / key)
            if isinstance(result, TrialResult):
                found[key] = result
        return found

    def finished(self) -> dict[str, bytes]:
        """Planned trials with a valid, not errored result.json: their bytes."""
        run_dir = self.run_dir()
        return {
            key: (run_dir / key / "result.json").read_bytes()
            for key, result in self.records().items()
            if not result.errored
        }

    def output_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def wait(process: subprocess.Popen, timeout: float = SESSION_TIMEOUT) -> int:
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return -999


def wait_for(predicate: Callable[[], bool], process: subprocess.Popen | None, timeout: float):
    """Poll until `predicate()`; False if the process ended or time ran out first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if process is not None and process.poll() is not None:
            return predicate()
        time.sleep(0.05)
    return False


# -- rows ------------------------------------------------------------------------------------------
@dataclass
class Row:
    name: str
    injected: str
    recorded: str = ""
    before: int = 0
    after: int = 0
    lost: int = 0
    recover_s: float = 0.0
    problems: list[str] = field(default_factory=list)
    skipped: str = ""
    kept: dict[str, bytes] = field(default_factory=dict)  # finished before the recovery step

    @property
    def ok(self) -> bool:
        return bool(self.skipped) or (self.lost == 0 and not self.problems)


def settle(row: Row, lab: Lab, before: dict[str, bytes], t_fault: float) -> None:
    """Fill in after / lost / recover s from the run dir as it is now. A trial finished at the
    fault, or before the recovery step, must be there unchanged."""
    after = lab.finished()
    changed = [k for k, data in (row.kept | before).items() if after.get(k) != data]
    missing = sorted(lab.planned - set(after))
    row.before, row.after = len(before), len(after)
    row.lost = len(set(changed) | set(missing))
    if changed:
        row.problems.append(f"changed or gone: {', '.join(changed)}")
    if missing:
        row.problems.append(f"not finished at the end: {', '.join(missing)}")
    row.recover_s = last_record_time(lab) - t_fault


def last_record_time(lab: Lab) -> float:
    run_dir = lab.run_dir()
    times = [(run_dir / k / "result.json").stat().st_mtime for k in lab.records()]
    return max(times, default=time.time())


def outcomes(lab: Lab) -> str:
    """What the records say: counts of exit codes, infra failures marked."""
    counts: dict[str, int] = {}
    for result in lab.records().values():
        if result.errored:
            label = f"infra (exit {result.exit_code})"
        elif result.exit_code == 124:
            label = "timed out (exit 124)"
        else:
            label = "finished"
        counts[label] = counts.get(label, 0) + 1
    return ", ".join(f"{n} {label}" for label, n in sorted(counts.items()))


def resume(row: Row, lab: Lab, *args: str, env: dict | None = None) -> int:
    row.kept = lab.finished()
    rc = lab.run("--gap-resume", *args, env=env)
    row.recorded += f"; --gap-resume exit {rc}"
    return rc


def children(pid: int, *, recursive: bool = False) -> dict[int, str]:
    """Child processes of `pid` (with `recursive`, all descendants) and their command lines,
    read from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = {}, {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        for child in frontier:
            with contextlib.suppress(OSError):
                cmdline = (Path("/proc") / str(child) / "cmdline").read_bytes()
                found[child] = cmdline.replace(b"\0", b" ").decode(errors="replace")
        if not recursive:
            break
    return found


def workers_of(process: subprocess.Popen) -> list[int]:
    """The session's xdist workers: its children that are not policy servers."""
    return [pid for pid, cmd in children(process.pid).items() if "serve" not in cmd]


def fault_worker_kill(root: Path) -> Row:
    row = Row("worker_kill", "SIGKILL one of 2 xdist workers mid-run (4 trials)")
    lab = Lab(root, row.name)
    lab.grid(seeds=4)
    session = lab.start("-n", "2")
    if not wait_for(lambda: len(lab.finished()) >= 1, session, 240):
        row.problems.append("no trial finished before the fault")
    victims = workers_of(session)
    t_fault = time.time()
    os.kill(victims[0], signal.SIGKILL)
    before = lab.finished()
    rc = wait(session)
    crashed = [k for k, r in lab.records().items() if r.exit_code == 137]
    row.recorded = f"exit {rc}: {outcomes(lab)}"
    if set(lab.records()) != lab.planned:
        row.problems.append("the run did not go on past the dead worker")
    if crashed:
        resume(row, lab)
    settle(row, lab, before, t_fault)
    return row


def fault_session_kill(root: Path) -> Row:
    row = Row("session_kill", "SIGKILL the whole session (process group, -n 2) mid-run")
    lab = Lab(root, row.name)
    lab.grid(seeds=4)
    session = lab.start("-n", "2")
    if not wait_for(lambda: len(lab.finished()) >= 2, session, 240):
        row.problems.append("fewer than 2 trials finished before the fault")
    t_fault = time.time()
    os.killpg(session.pid, signal.SIGKILL)
    rc = wait(session)
    before = lab.finished()
    summary = (lab.run_dir() / "summary.tsv").exists()
    row.recorded = f"exit {rc}, {len(before)} recorded, summary {'written' if summary else 'none'}"
    resume(row, lab)
    row.recorded += f": {len(lab.finished()) - len(before)} run, {len(before)} replayed"
    settle(row, lab, before, t_fault)
    return row


def fault_corrupt_result(root: Path) -> Row:
    row = Row("corrupt_result", "garbage / truncated / empty result.json of 3 of 4 finished trials")
    lab = Lab(root, row.name)
    lab.grid(seeds=4, overrides={"workflow": {"workflow_dir": "quick"}})
    rc = lab.run()
    if len(lab.finished()) != 4:
        row.problems.append(f"the clean run finished {len(lab.finished())} of 4 (exit {rc})")
    run_dir = lab.run_dir()
    damaged = sorted(lab.planned)[:3]
    t_fault = time.time()
    (run_dir / damaged[0] / "result.json").write_bytes(os.urandom(300))
    whole = (run_dir / damaged[1] / "result.json").read_bytes()
    (run_dir / damaged[1] / "result.json").write_bytes(whole[: len(whole) // 2])
    (run_dir / damaged[2] / "result.json").write_bytes(b"")
    before = lab.finished()
    rc = resume(row, lab)
    noted = lab.output_text().count("the trial was re-run")
    row.recorded = f"{noted} noted corrupt and re-run" + row.recorded
    if rc != 0:
        row.problems.append(f"--gap-resume exit {rc}")
    settle(row, lab, before, t_fault)
    return row


def fault_managed_server_kill(root: Path) -> Row:
    row = Row("managed_server_kill", "SIGKILL the managed `hold` policy server mid-run")
    lab = Lab(root, row.name)
    hold = {"command": [GAP, "policy", "serve", "hold", "--port", "{port}"]}
    lab.grid(
        "policy_only",
        seeds=6,
        max_steps=30,
        policies={"hold": hold},
        block={"policies": ["hold"]},
        overrides={"policy_only": {"template": "policy_only"}},
    )
    session = lab.start()
    if not wait_for(lambda: len(lab.finished()) >= 1, session, 240):
        row.problems.append("no trial finished before the fault")
    servers = [pid for pid, cmd in children(session.pid, recursive=True).items() if "serve" in cmd]
    t_fault = time.time()
    for server in servers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGKILL)
    before = lab.finished()
    rc = wait(session)
    errored = "errored cells" in lab.output_text()
    row.recorded = f"exit {rc}: {outcomes(lab)}{', cell errored' if errored else ''}"
    restarts = sorted(lab.run_dir().glob("policy_logs/restarts.log"))
    if restarts:
        lines = restarts[0].read_text().splitlines()
        rerun = sum(bool(getattr(r, "earlier_attempts", None)) for r in lab.records().values())
        row.recorded += f", {len(lines)} server restart(s) logged, {rerun} trial(s) re-run"
    if not servers:
        row.problems.append("no managed server process found")
    first_session_done = set(lab.finished()) == lab.planned
    if MANAGED_KILL_RECOVERY == "none" and not first_session_done:
        row.problems.append("the session did not finish every trial by itself")
    if not first_session_done:
        resume(row, lab)
    settle(row, lab, before, t_fault)
    return row


class FaultyPolicy:
    """A tiny openpi-protocol websocket server: metadata frame, then per observation frame
    `mode`: "ok" (a zero-motion chunk), "hang" (never answers), "garbage" (bytes that are not
    msgpack)."""

    def __init__(self, mode: str):
        from websockets.sync.server import serve

        self.mode, self.stop = mode, threading.Event()
        self.server = serve(self._handle, "127.0.0.1", 0, compression=None, max_size=None)
        self.url = f"ws://127.0.0.1:{self.server.socket.getsockname()[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _handle(self, ws) -> None:
        ws.send(packb({"policy": "faulty"}))
        chunk = packb({"actions": np.tile([0, 0, 0, 0, 0, 0, -1.0], (5, 1))})
        for _ in ws:
            if self.mode == "hang":
                self.stop.wait()
                return
            ws.send(b"\xc1 not msgpack" if self.mode == "garbage" else chunk)

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()


def _policy_fault(root: Path, name: str, mode: str, injected: str, seeds: int) -> Row:
    row = Row(name, injected)
    lab = Lab(root, name)
    server = FaultyPolicy(mode)
    try:
        lab.grid(
            "policy_only",
            seeds=seeds,
            max_steps=30,
            # a server that hangs does so at the warm-up already: within its own limit
            policies={"faulty": {"url": server.url, "obs_format": "gap", "warmup_timeout_s": 30}},
            block={"policies": ["faulty"]},
            overrides={"policy_only": {"template": "policy_only"}},
        )
        t_fault = time.time()
        rc = lab.run()
        errored = "errored cells" in lab.output_text()
        row.recorded = f"exit {rc}: {outcomes(lab)}{', cell errored' if errored else ''}"
        before = {}  # the fault was there from the start
        server.mode = "ok"  # the server is fixed; the documented recovery is --gap-resume
        resume(row, lab)
        settle(row, lab, before, t_fault)
    finally:
        server.close()
    return row


def fault_policy_hang(root: Path) -> Row:
    return _policy_fault(
        root, "policy_hang", "hang", "policy server stops answering (warm-up limit 30 s)", 1
    )


def fault_policy_garbage(root: Path) -> Row:
    return _policy_fault(root, "policy_garbage", "garbage", "policy server answers garbage", 2)


# -- an OpenAI-shaped LLM endpoint -----------------------------------------------------------------
GIVE_UP_GRAPH = json.dumps(
    _graph({"home": {"type": "tool", "skill": "home", "next": "failed"}, **FAILED_END}, "home")
    | {"description": "go home and stop"}
)
STAGES = json.dumps({"stages": [{"name": "stop", "goal": "give up", "skills": ["home"]}]})


class FaultyLLM:
    """POST /v1/chat/completions. The preflight (max_tokens 1) is always answered; generation
    requests get the `script` first ({"status": 500} / {"status": 429, "retry_after": "1"} /
    {"hang": True}), then good answers. `log` keeps (time, status) per generation request."""

    def __init__(self, script: list[dict]):
        self.script, self.log, self.stop = list(script), [], threading.Event()
        llm = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                if body.get("max_tokens") == 1:
                    return self._answer("OK")
                step = llm.script.pop(0) if llm.script else {}
                llm.log.append((time.time(), step.get("status", "hang" if step else 200)))
                if step.get("hang"):
                    llm.stop.wait()
                    return None
                if "status" in step:
                    data = json.dumps({"error": {"message": "injected fault"}}).encode()
                    self.send_response(step["status"])
                    if "retry_after" in step:
                        self.send_header("retry-after", step["retry_after"])
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return None
                system = body["messages"][0]["content"]
                return self._answer(STAGES if "You plan robot" in system else GIVE_UP_GRAPH)

            def _answer(self, content: str):
                data = json.dumps(
                    {
                        "id": "chatcmpl-faults",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": "faults",
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "message": {"role": "assistant", "content": content},
                            }
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def _llm_fault(
    root: Path, name: str, injected: str, script: list[dict], llm: dict | None = None, **trials
):
    row = Row(name, injected)
    lab = Lab(root, name)
    server = FaultyLLM(script)
    try:
        lab.grid(
            "llm_generation",
            seeds=2,
            llm={"model": "faults", "endpoint": server.url, "cache_dir": "cache", **(llm or {})},
            overrides={},
            trials=trials,
        )
        t_fault = time.time()
        rc = lab.run()
        errored = "errored cells" in lab.output_text()
        row.recorded = f"exit {rc}: {outcomes(lab)}{', cell errored' if errored else ''}"
        if any(r.exit_code == 124 for r in lab.records().values()):
            row.problems.append("the LLM's trouble was charged to a trial's watchdog (124)")
        faults = [(t, s) for t, s in server.log if s != 200]
        answered = [t for t, s in server.log if s == 200]
        if faults and answered:
            gaps = [b[0] - a[0] for a, b in itertools.pairwise([*faults, (answered[0], 200)])]
            row.recorded += f"; {len(faults)} faulty answers, next request after " + ", ".join(
                f"{g:.1f}" for g in gaps
            )
            row.recorded += " s"
        before = {}  # the fault was there from the start
        if set(lab.finished()) != lab.planned:
            server.script.clear()  # the endpoint is back; the documented recovery is --gap-resume
            resume(row, lab)
        settle(row, lab, before, t_fault)
        return row, server.log
    finally:
        server.close()


def fault_llm_500(root: Path) -> Row:
    row, _ = _llm_fault(root, "llm_500", "LLM answers 500 twice", [{"status": 500}] * 2)
    return row


def fault_llm_429(root: Path) -> Row:
    row, log = _llm_fault(
        root,
        "llm_429",
        "LLM answers 429 Retry-After: 1 twice",
        [{"status": 429, "retry_after": "1"}] * 2,
    )
    times = [t for t, _ in log]
    if len(times) >= 3 and min(b - a for a, b in itertools.pairwise(times[:3])) < 0.95:
        row.problems.append("Retry-After was not honoured")
    return row


def fault_llm_down(root: Path) -> Row:
    row, _ = _llm_fault(
        root, "llm_500_down", "LLM answers 500 to all 6 tries", [{"status": 500}] * 6
    )
    return row


def fault_llm_hang(root: Path) -> Row:
    # The request's own timeout ends the hang, not the trial's watchdog: producing is not
    # charged to it, so the retried request is answered and both trials are scored.
    row, _ = _llm_fault(
        root,
        "llm_hang",
        "LLM never answers one request (llm.timeout_s 5, watchdog 40 s)",
        [{"hang": True}],
        llm={"timeout_s": 5},
        task_timeout_secs=40,
    )
    return row


def fault_native_hang(root: Path) -> Row:
    row = Row("native_hang", "trial stuck in C (pthread_mutex_lock), signal watchdog 40 s, -n 2")
    lab = Lab(root, row.name)
    lab.grid(
        seeds=3, trials={"task_timeout_secs": 40}, overrides={"workflow": {"workflow_dir": "stuck"}}
    )
    marker = lab.dir / "hang-once"
    marker.write_text("")
    session = lab.start("-n", "2", env={"GAP_FAULTS_HANG": str(marker)})
    rc = wait(session)
    hung_at = Path(str(marker) + ".at")
    t_fault = float(hung_at.read_text()) if hung_at.exists() else time.time()
    row.recorded = f"exit {rc}: {outcomes(lab)}"
    if not hung_at.exists():
        row.problems.append("no trial hung")
    if set(lab.records()) != lab.planned:
        row.problems.append("the run did not go on past the stuck trial")
    if set(lab.finished()) != lab.planned:
        resume(row, lab, "-n", "2")
    settle(row, lab, {}, t_fault)
    return row


def fault_disk_full(root: Path) -> Row:
    row = Row("disk_full", "output dir on an 8 MiB tmpfs filled up mid-run (6 trials)")
    lab = Lab(root, row.name)
    fs = lab.dir / "fs"
    fs.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(fs)], capture_output=True
    )
    if mounted.returncode != 0:
        row.skipped = f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()})"
        return row
    try:
        lab.grid(seeds=6, output_dir="fs")
        session = lab.start()
        if not wait_for(lambda: len(lab.finished()) >= 1, session, 240):
            row.problems.append("no trial finished before the fault")
        t_fault = time.time()
        filler = fs / "filler"
        with filler.open("wb") as out, contextlib.suppress(OSError):
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        before = lab.finished()
        rc = wait(session)
        text = lab.output_text()
        not_recorded = text.count("not recorded: No space left on device")
        named = "gap: error: could not write the summaries" in text
        row.recorded = (
            f"exit {rc}: {outcomes(lab)}, {not_recorded} 'not recorded: No space left on "
            f"device'{', summaries not written (named)' if named else ''}"
            f"{', a traceback' if 'Traceback' in text else ''}"
        )
        filler.unlink()  # space is freed; the documented recovery is --gap-resume
        resume(row, lab)
        settle(row, lab, before, t_fault)
    finally:
        subprocess.run(["umount", "-l", str(fs)], capture_output=True)
    return row


FAULTS: dict[str, Callable[[Path], Row]] = {
    "worker_kill": fault_worker_kill,
    "session_kill": fault_session_kill,
    "managed_server_kill": fault_managed_server_kill,
    "policy_hang": fault_policy_hang,
    "policy_garbage": fault_policy_garbage,
    "llm_hang": fault_llm_hang,
    "llm_500": fault_llm_500,
    "llm_500_down": fault_llm_down,
    "llm_429": fault_llm_429,
    "native_hang": fault_native_hang,
    "corrupt_result": fault_corrupt_result,
    "disk_full": fault_disk_full,
}
SHORT = ["worker_kill", "session_kill", "corrupt_result", "llm_hang", "llm_429"]


def print_row(row: Row) -> None:
    if row.skipped:
        print(
            f"| {row.name} | {row.injected} | skipped: {row.skipped} | - | - | - | - |", flush=True
        )
        return
    recorded = row.recorded + ("" if row.ok else f" PROBLEM: {'; '.join(row.problems)}")
    print(
        f"| {row.name} | {row.injected} | {recorded} | {row.before} | {row.after} | {row.lost} "
        f"| {row.recover_s:.1f} |",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help=f"only {', '.join(SHORT)}")
    parser.add_argument("--only", help="comma-separated row names: " + ", ".join(FAULTS))
    parser.add_argument("--keep", type=Path, help="keep the scratch sessions under this dir")
    parser.add_argument(
        "--dos",
        action="store_true",
        help="then the denial-of-service rows (bench/dos.py): hostile frames and the memory each "
        "costs the server or client that refuses it",
    )
    args = parser.parse_args(argv)
    names = SHORT if args.short else list(FAULTS)
    if args.only:
        names = [n.strip() for n in args.only.split(",")]
        unknown = [n for n in names if n not in FAULTS]
        if unknown:
            parser.error(f"unknown fault {', '.join(unknown)}; known: {', '.join(FAULTS)}")
    root = Path(tempfile.mkdtemp(prefix="gap-faults-", dir=args.keep))
    started = time.monotonic()
    print("| fault | injected | harness recorded | finished before | after | lost | recover s |")
    print("| --- | --- | --- | --- | --- | --- | --- |", flush=True)
    rows = []
    try:
        for name in names:
            try:
                row = FAULTS[name](root)
            except Exception as exc:  # a row that breaks is a failed row, not a stopped campaign
                row = Row(name, name, problems=[f"{type(exc).__name__}: {exc}"], lost=-1)
            rows.append(row)
            print_row(row)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    bad = [r.name for r in rows if not r.ok]
    wall = time.monotonic() - started
    print(
        f"{len(rows)} faults in {wall:.0f} s; "
        + (f"FAILED: {', '.join(bad)}" if bad else "0 trials lost")
    )
    if args.keep is not None:
        print(f"sessions kept in {root} (sessions.log per fault)")
    dos_failed = False
    if args.dos:
        from bench.dos import main as dos_table

        print("\nDenial of service (bench/dos.py):", flush=True)
        dos_failed = dos_table([]) != 0
    return 1 if bad or dos_failed else 0


if __name__ == "__main__":
    sys.exit(main())
