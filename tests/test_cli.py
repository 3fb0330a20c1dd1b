"""The `gap` console script, run as a user runs it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

GAP = shutil.which("gap", path=str(Path(sys.executable).parent)) or "gap"


def _gap(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([GAP, *args], capture_output=True, text=True, timeout=120)


def test_gap_suites_lists_registry_and_one_suites_tasks():
    listing = _gap("suites")
    assert listing.returncode == 0
    assert "libero_object_swap" in listing.stdout and "libero_90" in listing.stdout
    one = _gap("suites", "libero_object")
    assert one.returncode == 0
    assert "10 tasks, max_steps 280" in one.stdout
    assert "50 init states  pick up the bbq sauce and place it in the basket" in one.stdout


def test_gap_families_maps_variations_to_suites():
    out = _gap("families")
    assert out.returncode == 0
    lines = {line.split()[0]: line.split()[-1] for line in out.stdout.splitlines()}
    assert lines["posvar/basket_swap"] == "libero_object"
    assert lines["libero_pro/object_swap"] == "libero_object_swap"


def test_unknown_suite_exits_2_with_one_line():
    out = _gap("suites", "libero_objekt")
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0
    assert "did you mean libero_object" in out.stderr
