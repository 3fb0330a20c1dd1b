"""A trial stuck in native code (a C call that signals do not interrupt) is still ended by the
watchdog, with its default `signal` method, and the run goes on."""

from __future__ import annotations

import pytest

from tests.fake_session import BACKEND, GIVE_UP, FakeSession, workflow

pytest_plugins = ["pytester"]

# A skill that blocks in C: glibc's pthread_mutex_lock on a normal mutex it already holds never
# returns, and no signal interrupts it (POSIX: it never fails with EINTR), so pytest-timeout's
# SIGALRM handler never gets to run.
NATIVE_HANG = '''

import ctypes

class Stuck(BaseModel):
    never: bool = True


@skill(scene=False)
def native_hang(ctx: SkillContext) -> Stuck:
    """Block forever in pthread_mutex_lock (relocking a held normal mutex)."""
    libc = ctypes.CDLL(None)
    mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER on glibc
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)
    return Stuck()


# The backstop's grace (10 s by default, for C calls that do return) is idle time in these
# sessions: their one stuck call never returns, so 2 s ends it the same way, 8 s sooner.
from pytest_gap.plugin import watchdog as _watchdog

_watchdog.BACKSTOP_GRACE_S = 2.0
'''


@pytest.fixture
def fake(pytester) -> FakeSession:
    session = FakeSession(pytester)
    conftest = pytester.path / "conftest.py"
    conftest.write_text(conftest.read_text() + NATIVE_HANG)
    session.workflow(
        "stuck",
        workflow(
            {
                "hang": {"type": "tool", "skill": "native_hang", "next": "failed"},
                "failed": {"type": "end", "status": "failure"},
            },
            "hang",
        ),
    )
    session.config(
        {
            "backend": BACKEND,
            "trials": {"output_dir": "runs", "task_timeout_secs": 3},
            "suites": [
                {"suite_name": "fake_easy", "task_ids": [0], "workflow_dir": "stuck"},
                {"suite_name": "fake_easy", "task_ids": [1], "seeds": [1], "workflow_dir": "wf"},
            ],
            "gate_threshold": 0.0,
        }
    )
    return session


def test_a_trial_hung_in_native_code_ends_its_worker_as_a_timeout_and_the_run_goes_on(fake):
    result = fake.run("bench.yaml", "-n", "1", timeout=90)
    out = result.stdout.str()
    results = fake.results(fake.run_dir())
    stuck = results["suites/fake_easy/task_00/seed_000"]
    assert stuck["exit_code"] == 124 and not stuck["infra_failure"], stuck
    assert "the watchdog killed its worker" in stuck["reason"]
    assert results["suites/fake_easy_02/task_01/seed_001"]["exit_code"] == 0, out
    assert result.ret == 0, out  # a timeout is a failed trial; the 0.0 gate passes


def test_a_single_process_session_stuck_in_native_code_records_it_and_resumes(fake):
    stopped = fake.run("bench.yaml", timeout=90)
    assert stopped.ret == 1
    assert "stuck in code signals do not interrupt" in stopped.stderr.str()
    assert "finish the run with --gap-resume" in stopped.stderr.str()
    run_dir = fake.run_dir()
    stuck = fake.results(run_dir)["suites/fake_easy/task_00/seed_000"]
    assert stuck["exit_code"] == 124 and not stuck["infra_failure"], stuck
    fake.workflow("stuck", GIVE_UP)  # were it re-run, it would now fail at once with exit 1
    resumed = fake.run("bench.yaml", "--gap-resume", timeout=90)
    assert resumed.ret == 0, resumed.stdout.str()
    after = fake.results(run_dir)
    assert after["suites/fake_easy/task_00/seed_000"] == stuck  # replayed, not re-run
    assert after["suites/fake_easy_02/task_01/seed_001"]["exit_code"] == 0
