"""bench/gpu_check.py at its smallest on this CPU machine (software GL): the check issue 37 runs
on a lent GPU reports the backend the harness chose, both LIBERO cameras' render time through the
harness's renderer, physics per control step, and whether two pinned processes rendered on the
EGL devices they were given; a device that does not exist fails that check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_gpu_check_reports_what_the_harness_chose_and_what_a_step_costs(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench/gpu_check.py"), "--out", str(tmp_path),
         "--suite", "libero_object", "--task", "0", "--frames", "1", "--steps", "2"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["backend"] in ("egl", "osmesa")  # chosen by sim/gl.py, none was set
    render = report["render"]
    assert set(render["ms_per_frame"]) == {"agentview", "robot0_eye_in_hand"}
    assert all(ms > 0 for ms in render["ms_per_frame"].values()) and render["mean_pixel"] > 0
    assert render["context"]["renderer"]  # the GL context it rendered with names itself
    assert report["physics"]["substeps"] == 25 and report["physics"]["ms_per_control_step"] > 0
    assert report["scene"]["drawn_faces"] > 100_000  # the whole LIBERO scene's visual meshes
    table = (tmp_path / "gpu_check.md").read_text()
    assert table.startswith("| what | measured |") and "| GL backend chosen |" in table
    if report["backend"] == "egl":
        pinned = report["pinned"]
        assert pinned["ok"], pinned
        for worker in pinned["workers"]:
            for path in ("mujoco", "harness"):  # MuJoCo's own context and the harness's
                assert worker[path]["egl_device"]["index"] == worker["given"]

        # a device this machine does not have: the check says so instead of passing
        sys.path.insert(0, str(ROOT))
        try:
            from bench.gpu_check import pinned_processes

            wrong = pinned_processes("7,8")
        finally:
            sys.path.remove(str(ROOT))
        assert not wrong["ok"]
        # each child ends with MuJoCo's own refusal of the device it was pinned to
        for worker, device in zip(wrong["workers"], ("7", "8"), strict=True):
            assert "MUJOCO_EGL_DEVICE_ID" in worker["error"] and device in worker["error"]
