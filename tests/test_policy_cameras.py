"""`skills.perception: policy_cameras`: the skills see only through the two cameras a policy
gets (front and wrist) and never ask the simulator's goal check; the default adds an overhead
camera. From the YAML through the plan and `gap run` to what the skills rendered."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from pytest_gap.config import BenchmarkConfig, Perception
from pytest_gap.plan import plan
from pytest_gap.skills import basic
from pytest_gap.skills.context import SkillContext
from pytest_gap.skills.perception_setting import PERCEPTION_CAMERAS
from pytest_gap.skills.registry import SkillFailure
from pytest_gap.workflow.executor import run_workflow
from pytest_gap.workflow.schema import load_workflow

ROOT = Path(__file__).resolve().parents[1]
GAP = str(Path(sys.executable).with_name("gap"))


def test_the_config_names_exactly_the_perception_settings_the_skills_know():
    assert set(get_args(Perception)) == set(PERCEPTION_CAMERAS)
    assert "birdview" not in PERCEPTION_CAMERAS["policy_cameras"]


def test_every_cell_of_a_config_carries_its_perception_setting():
    data = {
        "skills": {"perception": "policy_cameras"},
        "benchmark": {"families": ["libero"], "variations": ["goal"], "modes": ["workflow"]},
    }
    cells = plan(BenchmarkConfig.model_validate(data))
    assert cells and {c.perception for c in cells} == {"policy_cameras"}
    default = plan(BenchmarkConfig.model_validate({"benchmark": data["benchmark"]}))
    assert {c.perception for c in default} == {"privileged"}


def test_the_goal_check_is_refused_under_policy_cameras(object_env):
    object_env.reset(0)
    assert basic.check_success(SkillContext(object_env)).success is False
    with pytest.raises(SkillFailure, match="goal check is privileged"):
        basic.check_success(SkillContext(object_env, perception="policy_cameras"))


def _cameras_seen(trace_dir: Path) -> set[str]:
    images = (trace_dir / "images").glob("*.png")
    return {p.stem.rsplit("_", 1)[-1] for p in images}


def test_a_graph_under_policy_cameras_looks_through_front_and_wrist_only(object_env, tmp_path):
    """pick_place on libero_object task 0 succeeds seeing through the policy's cameras; the
    perception images in its trace come from the front and wrist cameras, none from above."""
    object_env.reset(1)
    graph = load_workflow(
        ROOT / "examples/workflows/pick_place",
        {"target": "alphabet soup", "container": "basket"},
    )
    result = run_workflow(
        graph, object_env, trace_dir=tmp_path, keep_images=True, perception="policy_cameras"
    )
    assert result.success, (result.exit_status, result.error)
    assert _cameras_seen(tmp_path) == {"agentview", "wrist"}


def test_gap_run_takes_the_perception_setting(tmp_path):
    """The CLI's flag reaches the skills: the do_task graph's perception images are the front
    and wrist cameras' (birdview without the flag is covered by the default runs)."""
    trace = tmp_path / "trace"
    out = subprocess.run(
        [GAP, "run", str(ROOT / "examples/workflows/do_task"), "--family", "libero",
         "--variation", "object", "--task", "0", "--seed", "0", "--images",
         "--trace-dir", str(trace), "--perception", "policy_cameras"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("SUCCESS")
    assert _cameras_seen(trace) == {"agentview", "wrist"}
    doc = json.loads((trace / "dag_trace.json").read_text())
    assert doc["result"]["success"] is True
