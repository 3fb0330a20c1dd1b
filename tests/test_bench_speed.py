"""The standing speed scripts (bench/vs_vla_eval.py, bench/scaling.py, bench/first_step.py) in
their tiniest form, on real LIBERO, real vla-eval and real policy servers on loopback: each runs
every side on the same episodes and prints its table and ratio lines. What they measure is
printed, never asserted."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RATIO = r"= (\d+\.\d+)x"


def _bench(script: str, *args: str) -> str:
    # The checkout first; what is inherited after it (the fast tier's tripwire, tests/tiers.py)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    return done.stdout


def test_vs_vla_eval_runs_the_same_episodes_on_every_side_and_prints_ratios():
    out = _bench("vs_vla_eval.py", "--episodes", "1", "--steps", "3", "--no-warmup")
    assert "libero_object task 0, seeds 0..0 (init states 0..0), 3 control steps" in out
    rows = {line[:24].strip(): line for line in out.splitlines() if "steps [" in line}
    assert list(rows) == ["ours, default", "ours, every step", "ours, vla-eval server", "vla-eval"]
    for line in rows.values():  # one episode of exactly 3 steps on each side
        assert line.split()[-2:] == ["steps", "[3]"] and " 1 " in line, out
    for label in ("at equal query rate (1 obs/step)", "same server", "at default protocols"):
        (line,) = [x for x in out.splitlines() if x.startswith(f"ratio {label}")]
        assert float(re.search(RATIO, line).group(1)) > 0, out
    breakdown = out.split("per-step breakdown")[1].splitlines()
    assert breakdown[1].split()[1:] == [
        "physics", "render", "physics+render", "policy", "harness", "total",
    ]  # fmt: skip


def test_scaling_runs_one_config_under_n1_and_n2_and_prints_the_ratio():
    out = _bench("scaling.py", "--tasks", "1", "--seeds", "2", "--steps", "3")
    assert "tasks 0..0 x seeds 0..1 = 2 trials, 3 steps" in out
    assert re.search(r"^pytest -n 1 +\d+\.\d s", out, re.M), out
    assert re.search(r"^pytest -n 2 +\d+\.\d s", out, re.M), out
    (line,) = [x for x in out.splitlines() if x.startswith("ratio -n 2 over -n 1")]
    assert float(re.search(RATIO, line).group(1)) > 0, out


def test_first_step_prints_each_stage_compiled_and_from_the_scene_cache():
    out = _bench("first_step.py", "--rounds", "1")
    table = out.split("stage ")[1].split("first control step")[0].splitlines()
    stages = [line.split()[0] for line in table[1:]]
    assert stages == [
        "imported", "configured", "collected", "env_built", "env_reset", "first_step", "session",
    ], out  # fmt: skip
    for line in table[1:]:
        compiled, cached = (float(x.rstrip("s")) for x in line.split()[1:])
        assert compiled > 0 and cached > 0, out
    assert re.search(r"^first control step at \d+\.\d+ s compiled, \d+\.\d+ s with", out, re.M)


def test_step_evidence_times_the_same_steps_with_the_log_and_without():
    out = _bench("step_evidence.py", "--steps", "6", "--rounds", "2")
    assert "libero_object task 0, 6 steps, cameras: none" in out
    for name in ("steps", "episode"):
        (line,) = [line for line in out.splitlines() if line.startswith(name + " ")]
        assert "without the log" in line and "median of 2 rounds each" in line
        assert re.search(r"the log's own calls +\d+\.\d us a step = \d+\.\d\d% of the step", line)
