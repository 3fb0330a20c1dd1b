"""A managed policy server SIGKILLed mid-run, on real LIBERO: the session restarts it, re-runs
the trial it broke and loses none; a server that cannot come back errors its cell and fails the
gate with the reason (the floor when restarts are exhausted)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

pytest_plugins = ["pytester"]

GAP = shutil.which("gap", path=str(Path(sys.executable).parent)) or "gap"
TIMEOUT = 240
N_SEEDS = 3

# Zero motion; once the test asks (a `go` file), the next call blocks until the test kills the
# process: the kill lands mid-trial, after at least one trial was recorded.
BLOCKING_POLICY = """
import os, time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


class HoldUntilKilled:
    def infer(self, obs):
        if (HERE / "go").exists() and not (HERE / "blocked").exists():
            # renamed into place whole: the test reads the pid as soon as the file exists
            (HERE / "blocked.part").write_text(str(os.getpid()))
            os.replace(HERE / "blocked.part", HERE / "blocked")
            time.sleep(120)
        return {"actions": np.tile([0, 0, 0, 0, 0, 0, -1.0], (5, 1))}
"""
# Serves the blocking policy the first time it is started; every later start exits 3.
SERVE_ONCE = """
import os, sys
from pathlib import Path
flag = Path(__file__).with_name("served_once")
if flag.exists():
    print("serve_once: refusing to serve again", flush=True)
    sys.exit(3)
flag.write_text("")
os.execv(sys.executable, [sys.executable, "-m", "pytest_gap.cli", "policy", "serve",
                          "blocking_policy:HoldUntilKilled", "--port", sys.argv[1]])
"""


def _grid(path: Path, command: list[str], max_restarts: int) -> None:
    (path / "blocking_policy.py").write_text(BLOCKING_POLICY)
    pythonpath = os.pathsep.join(p for p in (str(path), os.environ.get("PYTHONPATH")) if p)
    data = {
        "policies": {"blk": {"command": command, "env": {"PYTHONPATH": pythonpath}}},
        "policy_manager": {"max_restarts": max_restarts, "restart_backoff_s": 0.2},
        "trials": {"max_steps": 25},
        "benchmark": {
            "families": ["libero"],
            "variations": ["object"],
            "modes": ["policy_only"],
            "policies": ["blk"],
            "task_ids": [0],
            "n_seeds": N_SEEDS,
            "num_workers": 1,
            "gate_threshold": 0.0,
            "output_dir": "runs",
            "mode_overrides": {"policy_only": {"template": "policy_only"}},
        },
    }
    (path / "grid.yaml").write_text(yaml.safe_dump(data))


def _run_and_kill(path: Path, *args: str) -> tuple[int, str]:
    """Run the session; once a trial is recorded, SIGKILL the server mid-call by the pid the
    run dir publishes. Returns the session's exit status and output."""
    out = path / "session.out"
    with out.open("w") as sink:
        session = subprocess.Popen(
            [sys.executable, "-m", "pytest", "grid.yaml", "-p", "no:cacheprovider", *args],
            cwd=path,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + TIMEOUT
        while not list((path / "runs").rglob("result.json")):
            assert session.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.05)
        (path / "go").write_text("")
        while not (path / "blocked").exists():
            assert session.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.05)
        (servers,) = (path / "runs").rglob("servers.json")
        pid = json.loads(servers.read_text())["servers"]["blk"]["pid"]
        assert pid == int((path / "blocked").read_text())
        os.kill(pid, signal.SIGKILL)
        session.wait(TIMEOUT)
    finally:
        session.kill()
        session.wait()
    return session.returncode, out.read_text()


def _records(path: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((path / "runs").rglob("result.json"))]


def _row(path: Path) -> dict:
    tsv = next((path / "runs").rglob("summary.tsv")).read_text().splitlines()
    return dict(zip(tsv[0].split("\t"), tsv[1].split("\t"), strict=True))


def test_a_server_killed_mid_run_is_restarted_and_the_broken_trial_rerun(pytester):
    path = pytester.path
    _grid(path, [GAP, "policy", "serve", "blocking_policy:HoldUntilKilled", "--port", "{port}"], 2)
    # under xdist: the controller owns and restarts the server, the worker waits and re-runs
    code, out = _run_and_kill(path, "-n", "1")
    assert code == 0, out  # every trial scored (holding still fails), the 0.0 gate passes
    assert "gate PASS" in out
    assert "gap: policy server blk exited with status -9 (SIGKILL); restart 1/2 after 0.2 s: " in (
        out
    )
    assert "its log ended: " in out
    records = _records(path)
    assert len(records) == N_SEEDS  # no trial lost, none counted twice
    assert [r["seed"] for r in records] == list(range(N_SEEDS))
    assert not any(r["error"] or r["infra_failure"] for r in records), records
    rerun = [r for r in records if r["earlier_attempts"]]
    assert rerun, "the trial the kill broke was not re-run"
    (broken,) = rerun[0]["earlier_attempts"]
    assert "closed the connection" in broken["error"] or "unreachable" in broken["error"]
    assert broken["rerun_because"].startswith("policy server blk died during it and was restarted")
    assert rerun[0]["policy_url"] != broken["policy_url"]  # the restart is on a new port
    assert f"{rerun[0]['nodeid']}: re-run, policy server blk died during it" in out
    row = _row(path)
    assert (row["n_trials"], row["n_infra"], row["error"]) == (str(N_SEEDS), "0", "")
    # the run dir keeps the restart: its log, the servers' state, the manifest
    (restarts,) = (path / "runs").rglob("restarts.log")
    assert "policy server blk exited with status -9 (SIGKILL); restart 1/2" in restarts.read_text()
    manifest = json.loads(next((path / "runs").rglob("run_manifest.json")).read_text())
    servers = manifest["policy_servers"]
    assert servers["servers"]["blk"] | {"reason": None} == {
        "state": "up",
        "deaths": 1,
        "restarts": 1,
        "max_restarts": 2,
        "reason": None,
    }
    (event,) = servers["restarts"]
    assert (event["exit_status"], event["attempt"], event["outcome"]) == (-9, 1, "up")
    # the re-run's record is final: resuming replays all three and runs none
    resumed = subprocess.run(
        # -rN: each replayed trial's message once, not again in the short summary (which CI=1
        # prints untruncated)
        [
            sys.executable,
            "-m",
            "pytest",
            "grid.yaml",
            "-p",
            "no:cacheprovider",
            "--gap-resume",
            "-rN",
        ],
        cwd=path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert resumed.returncode == 0, resumed.stdout
    assert resumed.stdout.count("(recorded by an earlier session, not re-run)") == N_SEEDS
    assert _records(path) == records


def test_a_server_that_cannot_come_back_errors_its_cell_and_fails_the_gate(pytester):
    path = pytester.path
    (path / "serve_once.py").write_text(SERVE_ONCE)
    _grid(path, [sys.executable, str(path / "serve_once.py"), "{port}"], 2)
    code, out = _run_and_kill(path)  # one process: it owns the server and runs the trials
    assert code == 1, out
    assert "gap: policy server blk exited with status 3; restart 2/2 after 0.4 s: failed: " in out
    reason = (
        "policy server blk could not be kept up: it exited with status -9 (SIGKILL) and 2 of 2 "
        "restarts (policy_manager.max_restarts) did not come up"
    )
    assert f"gap: {reason}" in out and "serve_once: refusing to serve again" in out
    assert "gate FAIL" in out and "errored cells: policy_only@blk libero/object" in out
    records = _records(path)
    assert len(records) == N_SEEDS  # none lost
    failed = [r for r in records if r["infra_failure"]]
    assert failed and all(reason in r["error"] for r in failed), failed
    # the broken trial ran (its server closed on it mid-call); the ones after it never started
    assert "closed the connection" in failed[0]["error"]
    assert not failed[0]["error"].startswith(reason)
    assert all(r["steps"] == 0 and r["error"].startswith(reason) for r in failed[1:])
    assert not any(r["earlier_attempts"] for r in records)
    row = _row(path)
    assert int(row["n_infra"]) == len(failed) and int(row["n_trials"]) == N_SEEDS - len(failed)
    assert reason in row["error"]
