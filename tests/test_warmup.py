"""A cold policy server does not error the first trial: each process warms each server once
before its first measured trial, charged to no trial and recorded; measured replies get
`policies.<id>.timeout_s`, the warm-up `warmup_timeout_s` (issue 32 section 1). Whole pytest
sessions on real LIBERO against `gap policy serve` processes the session manages.

No assertion bounds how long honest work takes (a loaded machine stretches it): what is
checked is which call was the slow one, and that a trial's times and the warm-up's add up to no
more than the time pytest itself measured for the trial's item."""

from __future__ import annotations

import json
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

pytest_plugins = ["pytester"]

GAP = shutil.which("gap", path=str(Path(sys.executable).parent)) or "gap"
STEPS = 10
FIRST_INFERENCE_S = 4.0  # a model compiling on its first call, as openpi's does

COLD_POLICY = f"""
import time
import numpy as np


class Cold:
    '''Zero motion; its first inference takes {FIRST_INFERENCE_S} s, every other none.'''

    calls = 0

    def infer(self, obs):
        Cold.calls += 1
        if Cold.calls == 1:
            time.sleep({FIRST_INFERENCE_S})
        return {{"actions": np.tile([0, 0, 0, 0, 0, 0, -1.0], (5, 1))}}
"""


def _session(pytester, **entry) -> tuple[object, list[dict], dict[int, float]]:
    """The session's result, its trial records, and the seconds pytest measured for each
    trial item's call (its JUnit report, by seed), which hold the whole trial and its warm-up."""
    (pytester.path / "cold_policy.py").write_text(COLD_POLICY)
    config = {
        "policies": {
            "cold": {
                "command": [GAP, "policy", "serve", "cold_policy:Cold", "--port", "{port}"],
                "env": {"PYTHONPATH": str(pytester.path)},
                **entry,
            }
        },
        "policy_manager": {"max_restarts": 0},
        "trials": {"max_steps": STEPS},
        "benchmark": {
            "families": ["libero"],
            "variations": ["object"],
            "modes": ["policy_only"],
            "policies": ["cold"],
            "task_ids": [0],
            "seeds": [0, 1],
            "num_workers": 1,
            "gate_threshold": 0.0,
            "output_dir": "runs",
            "mode_overrides": {"policy_only": {"template": "policy_only_bare"}},
        },
    }
    (pytester.path / "grid.yaml").write_text(yaml.safe_dump(config))
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest_subprocess(
        "grid.yaml", f"--junitxml={junit}", "-o", "junit_duration_report=call", timeout=300
    )
    records = [
        json.loads(p.read_text()) for p in sorted((pytester.path / "runs").rglob("result.json"))
    ]
    calls = {
        int(case.get("name").rsplit("seed", 1)[1]): float(case.get("time"))
        for case in ET.parse(junit).iter("testcase")
    }
    return result, records, calls


def test_a_cold_server_is_warmed_once_and_no_trial_pays_for_it(pytester):
    result, records, calls = _session(pytester)
    out = result.stdout.str()
    assert result.ret == 0, out
    assert len(records) == 2 and not any(r["infra_failure"] for r in records), out
    assert [r["steps"] for r in records] == [STEPS, STEPS]
    (warm,) = (pytester.path / "runs").rglob("warmup/cold.*.json")
    warmed = json.loads(warm.read_text())
    # Only the server's first inference is slow, and the warm-up had it: no trial waited for
    # it (a trial that had would have waited the 4 s inside its evaluation).
    assert warmed["inference_s"] >= FIRST_INFERENCE_S and warmed["timeout_s"] == 300
    assert warmed["before_trial"] == "policy_only/cold/libero/object/task_00/seed_000"
    # Charged to no trial: the warm-up ran inside the first trial's item, and its seconds were
    # taken off that trial's wall and evaluation times, so the sums below hold however long
    # the trial took. Charged to the trial, its seconds would count twice and exceed the
    # item's time by their excess over what the item spends outside the trial's wall (ms) and
    # evaluation (its env's build, a few seconds against the warm-up's 4 s and more).
    first = next(r for r in records if r["seed"] == 0)
    assert first["eval_s"] + warmed["seconds"] <= calls[0], (first, warmed, calls)
    assert first["wall_s"] + warmed["seconds"] <= calls[0], (first, warmed, calls)
    second = next(r for r in records if r["seed"] == 1)
    assert second["wall_s"] <= calls[1]


def test_a_warm_up_past_its_own_limit_is_an_infrastructure_failure_that_says_so(pytester):
    result, records, _ = _session(pytester, warmup_timeout_s=1.0)
    assert result.ret == 1  # errored trials error the cell, which fails the gate
    first = next(r for r in records if r["seed"] == 0)
    assert first["infra_failure"] and not first["success"]
    assert "the warm-up inference of policy cold at ws://127.0.0.1:" in first["error"]
    assert "warmup_timeout_s 1" in first["error"] and "within 1 s" in first["error"]
