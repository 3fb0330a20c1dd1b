"""The supervisor of managed policy servers, on real server processes (no simulator): a server
SIGKILLed is restarted once per death on a new port and published; one that cannot come back is
marked down with the reason after its bounded restarts; a trial's watch tells a death from
another infrastructure failure."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

from pytest_gap.config import PolicyEntry, PolicyManagerConfig
from pytest_gap.policies.client import PolicyClient
from pytest_gap.servers.manager import PolicyManager
from pytest_gap.servers.supervisor import (
    RESTART_LOG,
    Before,
    ServerWatch,
    Supervisor,
    read_state,
)

GAP = shutil.which("gap", path=str(Path(sys.executable).parent)) or "gap"
SERVE_HOLD = [GAP, "policy", "serve", "hold", "--port", "{port}"]
# Serves `hold` the first time it is started; every later start exits 3 before listening.
SERVE_ONCE = """
import os, sys
from pathlib import Path
flag = Path(sys.argv[2])
if flag.exists():
    print("serve_once: refusing to serve again", flush=True)
    sys.exit(3)
flag.write_text("")
os.execv(sys.executable, [sys.executable, "-m", "pytest_gap.cli", "policy", "serve", "hold",
                          "--port", sys.argv[1]])
"""


def _until(check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return found


def _supervised(tmp_path: Path, entry: PolicyEntry, **settings):
    manager = PolicyManager(PolicyManagerConfig(startup_timeout_s=30, **settings), tmp_path)
    manager.start_all({"hold": entry})
    supervisor = Supervisor(manager, tmp_path)
    supervisor.start()
    return manager, supervisor


def _stop(manager: PolicyManager, supervisor: Supervisor) -> None:
    supervisor.stop()
    manager.stop_all()


def _drain(supervisor: Supervisor) -> list[str]:
    lines = []
    while not supervisor.lines.empty():
        lines.append(supervisor.lines.get())
    return lines


def test_a_killed_server_is_restarted_once_on_a_new_port_and_published(tmp_path):
    manager, supervisor = _supervised(
        tmp_path, PolicyEntry(command=SERVE_HOLD), max_restarts=2, restart_backoff_s=0.1
    )
    try:
        watch = ServerWatch(tmp_path, "hold", manager.settings, grace_s=0.3)
        first = read_state(tmp_path).servers["hold"]
        assert first.state == "up" and first.pid == manager.servers["hold"].process.pid
        before = watch.before_trial()
        assert before == Before(deaths=0)
        # an infrastructure failure while the server lives is not a death: no re-run
        assert not watch.after_failure(before).rerun

        os.kill(first.pid, signal.SIGKILL)
        verdict = watch.after_failure(before)  # waits for the lead's restart
        state = read_state(tmp_path)
        now = state.servers["hold"]
        assert verdict.rerun and verdict.reason is None and verdict.deaths == 1
        assert verdict.because == (
            f"policy server hold died during it and was restarted (1/2, now {now.url})"
        )
        assert (now.state, now.deaths, now.restarts) == ("up", 1, 1)
        assert now.url != first.url and now.pid != first.pid
        with PolicyClient(now.url) as client:
            assert client.metadata == {"policy": "hold"}

        (event,) = state.restarts  # one death, one restart
        assert (event.exit_status, event.attempt, event.of, event.outcome) == (-9, 1, 2, "up")
        assert any("serving hold" in line for line in event.log_tail)
        (line,) = _drain(supervisor)
        assert line.startswith(
            "policy server hold exited with status -9 (SIGKILL); restart 1/2 after 0.1 s: "
            f"up on {now.url}; its log ended: "
        )
        assert line in (tmp_path / RESTART_LOG).read_text()
        assert watch.before_trial() == Before(deaths=1)
    finally:
        _stop(manager, supervisor)


def test_a_server_that_cannot_come_back_is_down_with_the_reason(tmp_path):
    (tmp_path / "serve_once.py").write_text(SERVE_ONCE)
    entry = PolicyEntry(
        command=[sys.executable, str(tmp_path / "serve_once.py"), "{port}", str(tmp_path / "f")]
    )
    manager, supervisor = _supervised(tmp_path, entry, max_restarts=2, restart_backoff_s=0.05)
    try:
        watch = ServerWatch(tmp_path, "hold", manager.settings)
        before = watch.before_trial()
        os.kill(manager.servers["hold"].process.pid, signal.SIGKILL)
        verdict = watch.after_failure(before)
        assert not verdict.rerun
        assert verdict.reason.startswith(
            "policy server hold could not be kept up: it exited with status -9 (SIGKILL) and 2 "
            "of 2 restarts (policy_manager.max_restarts) did not come up; the last: "
            "policies.hold: the server exited with status 3 before listening"
        )
        assert watch.before_trial().down == verdict.reason  # later trials do not run
        state = read_state(tmp_path)
        assert [(e.attempt, e.outcome, e.exit_status) for e in state.restarts] == [
            (1, "failed", -9),
            (2, "failed", 3),
        ]
        assert state.restarts[1].log_tail[-1] == "serve_once: refusing to serve again"
        lines = _drain(supervisor)
        assert [line.split(":")[0] for line in lines] == [
            "policy server hold exited with status -9 (SIGKILL); restart 1/2 after 0.05 s",
            "policy server hold exited with status 3; restart 2/2 after 0.1 s",
            "policy server hold could not be kept up",
        ]
    finally:
        _stop(manager, supervisor)


def test_restarts_off_leaves_the_server_down_at_once(tmp_path):
    manager, supervisor = _supervised(tmp_path, PolicyEntry(command=SERVE_HOLD), max_restarts=0)
    try:
        os.kill(manager.servers["hold"].process.pid, signal.SIGKILL)
        state = _until(lambda: (s := read_state(tmp_path).servers["hold"]).state == "down" and s)
        assert state.reason.startswith(
            "policy server hold could not be kept up: it exited with status -9 (SIGKILL) and "
            "restarts are off (policy_manager.max_restarts: 0); its output is in "
        )
        assert read_state(tmp_path).restarts == []
    finally:
        _stop(manager, supervisor)


class _Watchdog:
    """Records what run_supervised asks of the trial's watchdog."""

    started = None

    def __init__(self):
        self.calls: list[str] = []

    def pause(self):
        self.calls.append("pause")

    def resume(self):
        self.calls.append("resume")

    def restart(self):
        self.calls.append("restart")


def test_a_trial_its_server_keeps_breaking_is_rerun_once_and_recorded_once(tmp_path):
    """A server that dies during every attempt: one re-run after the first restart, then the
    trial stays an infrastructure failure; one record, listing the broken attempt."""
    from pytest_gap.config import parse_config
    from pytest_gap.plan import all_trials, plan
    from pytest_gap.results import TrialIdentity, TrialResult, read_result, write_result
    from pytest_gap.run.supervised import run_supervised

    config = parse_config(
        {
            "policies": {"hold": {"command": SERVE_HOLD}},
            "policy_manager": {"max_restarts": 3, "restart_backoff_s": 0.05},
            "benchmark": {
                "families": ["libero"],
                "variations": ["object"],
                "modes": ["policy_only"],
                "policies": ["hold"],
                "task_ids": [0],
                "n_seeds": 1,
                "mode_overrides": {"policy_only": {"template": "policy_only"}},
            },
        },
        "grid.yaml",
        base=tmp_path,
    )
    (trial,) = all_trials(plan(config))
    run_dir = tmp_path / "run"
    manager, supervisor = _supervised(
        run_dir / "policy_logs",
        PolicyEntry(command=SERVE_HOLD),
        max_restarts=3,
        restart_backoff_s=0.05,
    )
    attempts = []

    def attempt(trial, earlier):
        """An attempt during which the server is SIGKILLed: the client sees it close."""
        attempts.append(list(earlier))
        os.kill(manager.servers["hold"].process.pid, signal.SIGKILL)
        result = TrialResult(
            **TrialIdentity.of(trial, nodeid="grid.yaml::t", config="grid.yaml").model_dump(),
            exit_code=1,
            error=f"policy: policy server closed the connection (attempt {len(attempts)})",
            infra_failure=True,
            earlier_attempts=earlier,
        )
        write_result(run_dir / trial.key, result)
        return result

    watchdog = _Watchdog()
    try:
        watch = ServerWatch.for_cell(run_dir, trial.cell, config)
        result, notes = run_supervised(trial, attempt, watch, watchdog, run_dir)
    finally:
        _stop(manager, supervisor)
    assert [len(e) for e in attempts] == [0, 1]  # re-run once, not twice
    assert result.infra_failure and result.error.endswith("(attempt 2)")
    (broken,) = result.earlier_attempts
    assert broken.error.endswith("(attempt 1)")
    assert broken.rerun_because.startswith("policy server hold died during it and was restarted")
    assert read_result(run_dir / trial.key) == result  # one record, the last attempt's
    (note,) = notes
    assert note.startswith("grid.yaml::t: re-run, policy server hold died during it")
    # every wait is paused, the re-run gets a full budget
    assert watchdog.calls == ["pause", "resume", "pause", "resume", "restart", "pause", "resume"]
