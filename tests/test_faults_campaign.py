"""The fault-injection campaign's short form (bench/faults.py --short) on real LIBERO: a killed
xdist worker, a SIGKILLed session resumed, damaged result.json files resumed, an LLM endpoint
that hangs on one request (ended by its own timeout, not charged to the trial's watchdog) and
one answering 429: every row loses no trial, and the campaign exits 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHORT = {"worker_kill", "session_kill", "corrupt_result", "llm_hang", "llm_429"}


def test_the_short_fault_campaign_loses_no_trial():
    # The checkout first; what is inherited after it (the fast tier's tripwire, tests/tiers.py)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench/faults.py"), "--short"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = done.stdout + done.stderr
    rows = [line.split(" | ") for line in done.stdout.splitlines() if line.startswith("| ")]
    table = {cells[0].removeprefix("| ").strip(): cells for cells in rows[2:]}
    assert set(table) == SHORT, out
    for name, cells in table.items():
        before, after, lost = (int(cells[i]) for i in (3, 4, 5))
        # lost counts planned trials missing at the end too: 0 means every trial finished
        assert lost == 0 and "PROBLEM" not in cells[2], f"{name}: {out}"
        assert after >= max(before, 2), f"{name}: {out}"
    assert done.returncode == 0, out
    assert "0 trials lost" in done.stdout
