"""A run dir whose disk fills up mid-run: the trials that cannot be recorded fail with one line,
the summaries that cannot be written are named in one line, the session exits 1, nothing
recorded is lost, and --gap-resume finishes the run once there is room."""

from __future__ import annotations

import subprocess

import pytest

from tests.fake_session import BACKEND, FakeSession
from tests.needs import missing

pytest_plugins = ["pytester"]

# Fills the disk under $GAP_TEST_FILL just before trial seed 1 runs.
FILL = """

def pytest_runtest_call(item):
    fill = os.environ.get("GAP_TEST_FILL")
    trial = getattr(item, "trial", None)
    if fill and trial is not None and trial.seed == 1:
        with open(fill, "wb") as out:
            try:
                while True:
                    out.write(b"\\0" * 65536)
                    out.flush()
            except OSError:
                pass
"""


@pytest.fixture
def small_disk(pytester):
    fs = pytester.path / "fs"
    fs.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(fs)])
    except FileNotFoundError:
        missing("needs `mount` for a small tmpfs, and there is no mount command")
    if mounted.returncode != 0:
        missing("needs a tmpfs mount (root)")  # under CI: fails, so the run cannot pass without it
    yield fs
    subprocess.run(["umount", "-l", str(fs)])


def test_a_full_disk_fails_clearly_keeps_what_was_recorded_and_resumes(pytester, small_disk):
    fake = FakeSession(pytester)
    conftest = pytester.path / "conftest.py"
    conftest.write_text(conftest.read_text() + FILL)
    fake.config(
        {
            "backend": BACKEND,
            "trials": {"output_dir": "fs/runs"},
            "suites": [
                {
                    "suite_name": "fake_easy",
                    "task_ids": [0],
                    "seeds": [0, 1, 2],
                    "workflow_dir": "wf",
                }
            ],
            "gate_threshold": 0.0,
        }
    )
    filler = small_disk / "filler"
    # -rN: each message once, not again in the short summary (which CI=1 prints whole)
    full = fake.run("bench.yaml", "-rN", GAP_TEST_FILL=filler)
    out = full.stdout.str()
    assert full.ret == 1, out
    assert "Traceback" not in out and "OSError" not in out, out
    assert out.count("not recorded: No space left on device") == 2, out
    assert "gap: error: could not write the summaries of" in out, out
    run_dir = fake.run_dir("fs/runs")
    before = fake.results(run_dir)
    assert list(before) == ["suites/fake_easy/task_00/seed_000"]

    filler.unlink()
    resumed = fake.run("bench.yaml", "--gap-resume", GAP_TEST_FILL=None)
    assert resumed.ret == 0, resumed.stdout.str()
    after = fake.results(run_dir)
    assert after["suites/fake_easy/task_00/seed_000"] == before["suites/fake_easy/task_00/seed_000"]
    assert len(after) == 3 and (run_dir / "summary.tsv").is_file()
