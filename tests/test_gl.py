"""MUJOCO_GL: a user's choice is kept; otherwise egl, then osmesa; one clear error if none works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fake_session import GIVE_UP, write_workflow

_SCRIPT = """
import json, os, sys
from pytest_gap.sim import gl
{patch}
from pytest_gap.errors import RenderBackendError
from pytest_gap.sim.libero import EnvOptions, make_env
out = {{"chosen": gl.ensure_gl_backend(), "exported": os.environ.get("MUJOCO_GL")}}
with make_env("libero_object", 0) as env:
    env.reset(0)
    out["physics"] = env.step([0, 0, 0, 0, 0, 0, -1]).steps
    try:
        out["shape"] = list(env.scene.render("agentview", height=32, width=32).rgb.shape)
    except RenderBackendError as exc:
        out["error"] = str(exc)
print(json.dumps(out))
"""


# The same choice and render path (sim/render.py SceneRenderer) on a one-box model: a LIBERO scene
# costs a process about 5 s to build (its meshes and textures), which the choice does not need.
_TINY_SCRIPT = """
import json, os
import numpy as np
from pytest_gap.sim import gl
{patch}
from pytest_gap.errors import RenderBackendError
out = {{"chosen": gl.ensure_gl_backend(), "exported": os.environ.get("MUJOCO_GL")}}
import mujoco
from pytest_gap.sim.render import SceneRenderer
model = mujoco.MjModel.from_xml_string(
    '<mujoco><worldbody><light pos="0 0 2"/>'
    '<camera name="cam" pos="0 -1 0.5" xyaxes="1 0 0 0 0.5 1"/>'
    '<body><freejoint/><geom type="box" size=".1 .1 .1" rgba="1 0 0 1" group="1"/>'
    '</body></worldbody></mujoco>')
data = mujoco.MjData(model)
mujoco.mj_step(model, data)
try:
    image = SceneRenderer(model, data, np.zeros(model.ngeom, int), {{}}).rgb("cam", 32, 32)
    out["shape"] = list(image.shape)
    out["red"] = bool((image[..., 0] > 100).any())
except RenderBackendError as exc:
    out["error"] = str(exc)
print(json.dumps(out))
"""


def _run(env_gl: str | None, patch: str = "", script: str = _SCRIPT) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM")}
    if env_gl is not None:
        env["MUJOCO_GL"] = env_gl
    proc = subprocess.run(
        [sys.executable, "-c", script.format(patch=patch)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_unset_mujoco_gl_defaults_to_egl_and_is_exported_to_children():
    # The one-box model: rendering a LIBERO scene under EGL is test_an_env_renders_on_the_egl_...
    out = _run(None, script=_TINY_SCRIPT)
    assert out["chosen"] == out["exported"] == "egl"
    assert out["shape"] == [32, 32, 3] and out["red"]


def test_a_users_mujoco_gl_is_respected():
    out = _run("osmesa", script=_TINY_SCRIPT)
    assert out["chosen"] == out["exported"] == "osmesa"
    assert out["shape"] == [32, 32, 3] and out["red"]


def test_falls_back_to_osmesa_when_egl_fails():
    # Fault injection: this machine's EGL works, so the probe is told it did not.
    patch = (
        "real = gl._probe\ngl._probe = lambda b: 'EGL_NOT_INITIALIZED' if b == 'egl' else real(b)"
    )
    out = _run(None, patch, script=_TINY_SCRIPT)
    assert out["chosen"] == "osmesa" and out["shape"] == [32, 32, 3] and out["red"]


def test_no_backend_keeps_physics_and_gives_one_clear_render_error():
    patch = "gl._probe = lambda b: f'lib{b} missing'"
    out = _run(None, patch)
    assert out["chosen"] == "disable" and out["physics"] == 1
    message = out["error"]
    assert "\n" not in message
    assert "egl: libegl missing" in message and "osmesa: libosmesa missing" in message
    assert "install libegl1 libegl-mesa0 or libosmesa6" in message


def test_a_broken_user_backend_names_the_variable_and_the_fix():
    out = _run("glx", script=_TINY_SCRIPT)  # no X display on a headless machine
    assert out["chosen"] == "glx"
    assert out["error"].startswith("MUJOCO_GL=glx: could not create an OpenGL context")
    assert "\n" not in out["error"]
    assert "unset MUJOCO_GL" in out["error"]


@pytest.fixture(scope="module")
def rendered_session(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One real session for the two tests below (each asserts its own side of it): two trials
    that give up (task 0 and 1 of libero_object) under `-n 2 -rA`, with record_video (each env
    gets a camera, which renders the episode's first frame at reset) and _LATE_TEARDOWN as its
    conftest. Returns its dir and the finished process (stdout, stderr)."""
    import yaml

    home = tmp_path_factory.mktemp("gl_session")
    write_workflow(home / "give_up", GIVE_UP)
    grid = {
        "families": ["libero"],
        "variations": ["object"],
        "modes": ["workflow"],
        "task_ids": [0, 1],
        "n_seeds": 1,
        "output_dir": "runs",
        "mode_overrides": {"workflow": {"workflow_dir": str(home / "give_up")}},
    }
    config = {"trials": {"record_video": True}, "benchmark": grid}
    (home / "grid.yaml").write_text(yaml.safe_dump(config))
    (home / "conftest.py").write_text(_LATE_TEARDOWN)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}  # as pytester's
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "grid.yaml", "-p", "no:cacheprovider", "-n", "2", "-rA"],
        cwd=home,
        env={**env, "PY_COLORS": "0"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    return home, done


def test_robosuite_macro_advice_stays_out_of_trial_reports(rendered_session):
    """robosuite says "No private macro file found!" at its first import in every process:
    under xdist it landed in the first failed trial of each worker (stderr, log, warnings)."""
    _, result = rendered_session
    out = result.stdout + result.stderr
    # The short summary repeats each reason only where pytest does not truncate it (CI=1 does not).
    failure_sections = out.split("short test summary info")[0]
    assert result.returncode == 1 and failure_sections.count("task not completed: task") == 2, out
    assert out.count("No private macro file") <= 1
    assert "Captured" not in out and "warnings summary" not in out


_DEVICE_SCRIPT = """
import json
import numpy as np
import mujoco.egl
from pytest_gap.errors import RenderBackendError
from pytest_gap.sim.libero import make_env
out = {}
with make_env("libero_object", 0, egl_device=0) as env:
    env.reset(0)
    on_device = env.scene.render("agentview", height=48, width=48).rgb
    out["mujoco_display_untouched"] = mujoco.egl.EGL_DISPLAY is None
    out["context"] = type(env.scene.renderer._renderer(48, 48)._gl_context).__name__
with make_env("libero_object", 0) as env:
    env.reset(0)
    default = env.scene.render("agentview", height=48, width=48).rgb
out["same_image"] = bool(np.array_equal(on_device, default))
with make_env("libero_object", 0, egl_device=7) as env:
    env.reset(0)
    try:
        env.scene.render("agentview", height=48, width=48)
    except RenderBackendError as exc:
        out["error"] = str(exc)
print(json.dumps(out))
"""


def test_an_env_renders_on_the_egl_device_it_was_built_for():
    """Under EGL an env's contexts live on its own device's display, not on the process-wide
    one MuJoCo picks from MUJOCO_EGL_DEVICE_ID (this machine has one EGL device: Mesa's)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYOPENGL_PLATFORM",)}
    env["MUJOCO_GL"] = "egl"
    proc = subprocess.run(
        [sys.executable, "-c", _DEVICE_SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["context"] == "EGLDeviceContext" and out["mujoco_display_untouched"]
    assert out["same_image"]
    assert out["error"].startswith("EGL device 7 does not exist: this machine has 1 EGL device(s)")


# The inner session's conftest: what interpreter teardown does to a worker's env pool, made
# certain. After every atexit function ran (MuJoCo's eglTerminate among them), teardown drops
# module globals, the pool among them, and a garbage collection may come while stderr still
# prints: whether it does depends on the allocations of the teardown, so `pytest benchmarks/
# -n 2` printed the tracebacks and a one-trial session mostly did not. Registered before any GL
# display is made, this runs after their ends, as that teardown does.
_LATE_TEARDOWN = """
import atexit
import gc

from pytest_gap.sim import pool


def free_the_pool_late():
    pool._pool = None  # dropped unclosed, as teardown drops it
    gc.collect()


atexit.register(free_the_pool_late)
"""


def test_a_session_that_rendered_exits_without_tracebacks(rendered_session):
    """A session whose trials rendered ends quietly. MuJoCo terminates its EGL display at exit
    (atexit); a renderer freed after that printed an "Exception ignored in ... __del__"
    traceback for itself and one for its GL context: about 60 lines at the end of
    `pytest benchmarks/ -n 2`. sim/gl.py `close_at_exit` closes every renderer before."""
    home, result = rendered_session
    out = result.stdout + "\n" + result.stderr
    assert result.returncode == 1 and "2 failed" in out, out  # give_up fails both trials
    assert len(list((home / "runs").rglob("video.mp4"))) == 2, out  # each worker's camera rendered
    noisy = [ln for ln in out.splitlines() if "Traceback" in ln or "Exception ignored in" in ln]
    assert noisy == [], out
