"""The policy modes end to end: managed policy servers started by the session, run_policy on
real LIBERO, a server killed mid-trial recorded as an infrastructure failure, and preflight."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import yaml

from pytest_gap.viz.model import read_trace

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
GAP = shutil.which("gap", path=str(Path(sys.executable).parent)) or "gap"
TIMEOUT = 300
HOLD_STEPS = 20  # trials.max_steps of the sessions whose policy holds still

DYING_POLICY = '''
import os, signal
import numpy as np


class DieOnThirdCall:
    """Serves two chunks of zero motion, then its process is killed (an OOM kill, a crash)."""

    calls = 0

    def infer(self, obs):
        DieOnThirdCall.calls += 1
        if DieOnThirdCall.calls == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return {"actions": np.tile([0, 0, 0, 0, 0, 0, -1.0], (5, 1))}
'''


def _grid(
    pytester,
    policies: dict,
    mode: str,
    policy_ids: list[str],
    max_steps: int | None = None,
    max_restarts: int = 3,
) -> None:
    data = {
        "policies": policies,
        "policy_manager": {"max_restarts": max_restarts},
        "trials": {"max_steps": max_steps},
        "benchmark": {
            "families": ["libero"],
            "variations": ["object"],
            "modes": [mode],
            "policies": policy_ids,
            "task_ids": [0],
            "n_seeds": 1,
            "num_workers": 1,  # `gap benchmark` starts that many xdist workers
            "gate_threshold": 0.0,
            "output_dir": "runs",
            "mode_overrides": {mode: {"template": mode}},
        },
    }
    (pytester.path / "grid.yaml").write_text(yaml.safe_dump(data))


def _only_result(pytester) -> dict:
    (path,) = (pytester.path / "runs").rglob("result.json")
    return json.loads(path.read_text())


def test_policy_only_runs_a_managed_server_through_run_policy(pytester):
    _grid(
        pytester,
        {"hold": {"command": [GAP, "policy", "serve", "hold", "--port", "{port}"]}},
        "policy_only",
        ["hold"],
        max_steps=HOLD_STEPS,
    )
    # under xdist: the server started by the controller reaches the worker (workerinput)
    result = pytester.runpytest_subprocess("grid.yaml", "-n", "1", timeout=TIMEOUT)
    out = result.stdout.str()
    assert result.ret == 0, out  # the trial failed (holding still), the 0.0 gate passes
    record = _only_result(pytester)
    assert record["mode"] == "policy_only" and record["policy_id"] == "hold"
    assert not record["success"] and not record["infra_failure"] and record["error"] is None
    # zero motion for the whole step budget: the bring-up before it is not charged to it
    assert 0 < record["bringup_steps"] < 30
    assert record["steps"] == HOLD_STEPS  # the budget, at most: the bring-up has its own field
    assert record["exit_status"] == "step_limit"
    assert "policy_only@hold" in out and "hold" in out
    trace = next(Path(pytester.path / "runs").rglob("dag_trace.json"))
    nodes = {n["id"]: n for n in json.loads(trace.read_text())["nodes"]}
    assert nodes["bring_up"]["status"] == "ok"
    (policy,) = nodes["policy"]["executions"]
    assert policy["end_step"] - policy["start_step"] == HOLD_STEPS
    # the worker warmed the server before the trial first talked to it, charged to no trial
    (warm,) = (pytester.path / "runs").rglob("warmup/hold.*.json")
    warmed = json.loads(warm.read_text())
    assert warmed["before_trial"] == "policy_only/hold/libero/object/task_00/seed_000"
    assert warmed["inference_s"] > 0 and warmed["timeout_s"] == 300
    # every inference is timed in the trace (what `gap viz` shows per window)
    windows = read_trace(trace.parent, trace.parent).windows
    assert windows and [w.window for w in windows] == sorted(w.window for w in windows)
    assert all(w.infer_ms is not None and w.infer_ms > 0 and w.actions for w in windows)


def test_a_server_killed_mid_trial_is_an_infra_failure_not_a_policy_failure(pytester):
    (pytester.path / "dying_policy.py").write_text(DYING_POLICY)
    _grid(
        pytester,
        {
            "dying": {
                "command": [
                    GAP,
                    "policy",
                    "serve",
                    "dying_policy:DieOnThirdCall",
                    "--port",
                    "{port}",
                ],
                "env": {"PYTHONPATH": str(pytester.path)},
            }
        },
        "llm_plus_policy",
        ["dying"],
        max_restarts=0,  # the floor when restarts are used up (tests/test_policy_restarts.py)
    )
    result = pytester.runpytest_inprocess("grid.yaml")
    out = result.stdout.str()
    assert result.ret == 1, out  # an errored cell fails the gate whatever the threshold
    record = _only_result(pytester)
    assert record["infra_failure"] and record["exit_code"] == 1 and not record["success"]
    assert "policy server ws://127.0.0.1:" in record["error"]
    assert "closed the connection" in record["error"]
    assert (
        "policy server dying could not be kept up: it exited with status -9 (SIGKILL) and "
        "restarts are off (policy_manager.max_restarts: 0)"
    ) in record["error"]
    assert "infrastructure failure: task 0 seed 0" in out
    tsv = next((pytester.path / "runs").rglob("summary.tsv")).read_text().splitlines()
    row = dict(zip(tsv[0].split("\t"), tsv[1].split("\t"), strict=True))
    assert (row["n_trials"], row["n_infra"], row["policy_id"]) == ("0", "1", "dying")
    assert "llm_plus_policy@dying\tERR" in "\n".join(tsv)


def test_an_unreachable_external_policy_errors_its_cells_before_any_trial(pytester):
    """A server that is down is an infrastructure failure: errored cells, gate FAIL, exit 1."""
    _grid(pytester, {"ghost": {"url": "ws://127.0.0.1:9"}}, "policy_only", ["ghost"])
    result = pytester.runpytest_subprocess("grid.yaml", "-n", "2", timeout=120)
    out = result.stdout.str()
    assert result.ret == 1, out
    record = _only_result(pytester)
    assert record["infra_failure"] and record["steps"] == 0 and record["init_state"] is None
    assert "preflight: policy ghost at ws://127.0.0.1:9 did not answer" in record["error"]
    assert "infrastructure failure: task 0 seed 0" in out
    assert "gate FAIL" in out and "errored cells: policy_only@ghost libero/object" in out


def test_gap_benchmark_exits_1_on_a_server_that_dies_at_start_and_2_on_a_missing_program(
    pytester,
):
    import subprocess

    def benchmark() -> subprocess.CompletedProcess:
        return subprocess.run(
            [GAP, "benchmark", "grid.yaml", "--gate"],
            cwd=pytester.path,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )

    crash = [sys.executable, "-c", "import sys; sys.exit(3)"]
    _grid(pytester, {"crash": {"command": crash}}, "policy_only", ["crash"])
    infra = benchmark()
    assert infra.returncode == 1, infra.stdout + infra.stderr
    assert "gate FAIL: success_rate=0.000 threshold=0.000 (no trial was scored; errored " in (
        infra.stdout
    )
    record = _only_result(pytester)
    assert record["infra_failure"] and "crash: the server exited with status 3" in record["error"]
    tsv = next((pytester.path / "runs").rglob("summary.tsv")).read_text()
    assert "policy_only@crash\tERR" in tsv

    _grid(pytester, {"typo": {"command": ["serve-polcy", "{port}"]}}, "policy_only", ["typo"])
    config = benchmark()
    assert config.returncode == 2, config.stdout + config.stderr
    assert config.stderr == (
        "gap: error: policies.typo: the program 'serve-polcy' is not on PATH; install it or "
        "give its full path in policies.typo.command\n"
    )
    session = pytester.runpytest_subprocess("grid.yaml", timeout=60)  # the same, under pytest
    assert session.ret == 4
    assert "policies.typo: the program 'serve-polcy' is not on PATH" in session.stderr.str()


def test_the_scripted_oracle_succeeds_and_is_labelled_privileged(pytester):
    _grid(
        pytester,
        {
            "scripted": {
                "command": [GAP, "policy", "serve", "scripted", "--port", "{port}"],
                "privileged_state": True,
            }
        },
        "policy_only",
        ["scripted"],
    )
    (pytester.path / "grid.yaml").write_text(
        (pytester.path / "grid.yaml")
        .read_text()
        .replace("gate_threshold: 0.0", "gate_threshold: 1.0")
    )
    result = pytester.runpytest_inprocess("grid.yaml", "-v")
    out = result.stdout.str()
    assert result.ret == 0, out
    assert "grid.yaml::policy_only@scripted::libero/object::task00::seed000 PASSED" in out
    assert "gate PASS: success_rate=1.000 threshold=1.000" in out
    record = _only_result(pytester)
    assert record["success"] and record["exit_status"] == "task_success"
    tsv = next((pytester.path / "runs").rglob("summary.tsv")).read_text()
    assert "policy_only\tscripted [privileged]\tlibero\tobject" in tsv
    assert "policy_only@scripted[privileged]\t1.000" in tsv


def test_the_scripted_oracle_refuses_to_run_without_ground_truth(pytester):
    _grid(
        pytester,
        {"scripted": {"command": [GAP, "policy", "serve", "scripted", "--port", "{port}"]}},
        "policy_only",
        ["scripted"],
    )
    result = pytester.runpytest_inprocess("grid.yaml")
    record = _only_result(pytester)
    assert record["infra_failure"] and "needs privileged_state: true" in record["error"]
    assert result.ret == 1


def test_ctrl_c_stops_the_managed_servers(pytester):
    import re
    import signal
    import subprocess
    import time

    from pytest_gap.servers.manager import port_open

    _grid(
        pytester,
        {"hold": {"command": [GAP, "policy", "serve", "hold", "--port", "{port}"]}},
        "policy_only",
        ["hold"],
    )
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", "grid.yaml", "-p", "no:cacheprovider"],
        cwd=pytester.path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline, port = time.monotonic() + 120, None
        while port is None:
            assert time.monotonic() < deadline and session.poll() is None
            logs = list((pytester.path / "runs").rglob("policy_hold.log"))
            found = re.search(r":(\d+)", logs[0].read_text()) if logs else None
            port = int(found.group(1)) if found else None
            time.sleep(0.2)
        while not port_open(port):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(2)  # a trial is running now
        session.send_signal(signal.SIGINT)
        session.wait(60)
        deadline = time.monotonic() + 15
        while port_open(port):
            assert time.monotonic() < deadline, "the policy server outlived the session"
            time.sleep(0.2)
    finally:
        session.kill()
        session.wait()
