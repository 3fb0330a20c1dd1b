"""Frame strips (`trials.frames_every` / `--gap-frames`): every N-th agentview frame of a trial,
left to right in one WebP under <run dir>/frames/, named in result.json; a trial asked for one
that has none is errored."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml
from PIL import Image

from pytest_gap.config import ConfigError, parse_config
from pytest_gap.errors import SimInputError
from pytest_gap.sim.backend import EnvOptions, FrameStrip, get_backend
from pytest_gap.sim.libero import make_env
from pytest_gap.sim.pool import env_pool
from pytest_gap.sim.video import STRIP_HEIGHT, WEBP_MAX_SIDE, StripWriter, compose_strip
from pytest_gap.skills.catalogue import skill_names
from tests.fake_session import BACKEND, GIVE_UP, TESTS, write_workflow

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True, scope="module")
def _skills_loaded_before_inprocess_sessions():
    """pytester's in-process sessions drop the modules first imported inside them; the skill
    modules register into the (kept) registry, so a later import would register them twice."""
    skill_names()


UP = [0, 0, 1, 0, 0, 0, -1]


def _err(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.abs(x.astype(float) - y.astype(float)).mean())


def _open(path) -> tuple[str, tuple[int, int], np.ndarray]:
    """The image's format, size and pixels, read by Pillow."""
    with Image.open(path) as image:
        return image.format, image.size, np.asarray(image.convert("RGB"))


def _tiles(path) -> list[np.ndarray]:
    strip = _open(path)[2]
    assert strip.shape[0] == STRIP_HEIGHT
    return [strip[:, x : x + STRIP_HEIGHT] for x in range(0, strip.shape[1], STRIP_HEIGHT)]


# -- the env: what a strip holds, and what it costs ------------------------------------------------
@pytest.mark.images
def test_strip_holds_every_nth_frame_from_the_settled_scene_and_renders_only_those(tmp_path):
    """7 steps = 8 frames (the settled scene, then one per step); every 3rd: frames 0, 3, 6. A
    frames-only episode renders those 3, not 8; with a video too, the video's renders are shared."""
    # 128 px renders: a tile is the render itself (no resize), so only WebP's loss separates them.
    with make_env("libero_object", 0, EnvOptions(height=STRIP_HEIGHT, width=STRIP_HEIGHT)) as env:
        renders = []
        rgb = env.scene.renderer.rgb
        env.scene.renderer.rgb = lambda *a, **k: renders.append(1) or rgb(*a, **k)

        env.reset(0, frames=FrameStrip(path=tmp_path / "a.webp", every=3))
        assert len(renders) == 1  # the settled scene, for the strip
        settled = env.observe(("agentview",)).images["agentview"]  # a direct render of it
        renders.clear()
        for step in range(1, 8):
            env.step(UP)
            if step == 6:
                sixth = env.observe(("agentview",)).images["agentview"]
        assert len(renders) == 2 + 1  # steps 3 and 6 for the strip, plus the direct one
        assert env.finish_video() == 0  # no video; the strip is written
        tiles = _tiles(tmp_path / "a.webp")
        assert len(tiles) == math.ceil(8 / 3)  # read from the image's width
        assert _err(tiles[0], settled) < 3 and _err(tiles[2], sixth) < 3
        assert _err(tiles[0], sixth) > 2 * _err(tiles[0], settled)  # the arm moved

        renders.clear()
        env.reset(1, video=tmp_path / "b.mp4", frames=FrameStrip(path=tmp_path / "b.webp", every=2))
        for _ in range(4):
            env.step(UP)
        assert env.finish_video() == 5
        assert len(renders) == 5  # one per frame, for the video and the strip alike
        assert len(_tiles(tmp_path / "b.webp")) == 3  # frames 0, 2, 4


def test_a_strip_wider_than_webp_allows_wraps_onto_rows_of_the_same_tiles(tmp_path):
    per_row = WEBP_MAX_SIDE // STRIP_HEIGHT  # 127
    tiles = [Image.new("RGB", (STRIP_HEIGHT, STRIP_HEIGHT), (i, 0, 0)) for i in range(130)]
    sheet = compose_strip(tiles)
    assert sheet.size == (per_row * STRIP_HEIGHT, 2 * STRIP_HEIGHT)
    assert sheet.getpixel((0, STRIP_HEIGHT)) == (per_row, 0, 0)  # the 128th tile starts row 2
    assert compose_strip(tiles[:3]).size == (3 * STRIP_HEIGHT, STRIP_HEIGHT)

    writer = StripWriter(tmp_path / "none.webp")
    assert writer.close() == 0 and not (tmp_path / "none.webp").exists()  # nothing to show


def test_the_vla_eval_backend_refuses_frames_as_it_refuses_videos(tmp_path):
    env = get_backend("vla-eval").make_env("libero_object", 0)
    frames = FrameStrip(path=tmp_path / "s.webp", every=5)
    for call in (
        lambda: env.reset(0, frames=frames),
        lambda: env.run_episode(0, url="ws://127.0.0.1:9", frames=frames),
    ):
        with pytest.raises(SimInputError) as refused:
            call()
        message = str(refused.value)
        assert "\n" not in message
        assert message.startswith("trials.frames_every / --gap-frames: the vla-eval backend")
        assert "set frames_every: 0 or drop --gap-frames" in message
    assert not (tmp_path / "s.webp").exists()


# -- the setting -----------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [-1, "ten", True, 2.5, 10**12])
def test_a_bad_frames_every_is_one_line_naming_the_key_and_the_fix(bad):
    with pytest.raises(ConfigError) as error:
        parse_config({"trials": {"frames_every": bad}, "benchmark": {}})
    (line,) = str(error.value).splitlines()
    assert line.startswith("<config>: trials.frames_every: a whole number N >= 0")
    assert parse_config({"trials": {"frames_every": 4}, "benchmark": {}}).trials.frames_every == 4


@pytest.mark.parametrize("bad", ["-1", "ten", "1e3", str(10**12)])
def test_a_bad_gap_frames_option_is_a_usage_error_with_the_keys_bound(bad):
    import argparse

    from pytest_gap.plugin.options import frames_every

    with pytest.raises(argparse.ArgumentTypeError, match="a whole number N >= 0 \\(at most "):
        frames_every(bad)
    assert frames_every("0") == 0 and frames_every("5") == 5


def _fake_config(pytester, frames_every: int | None) -> None:
    """One trial on the fake backend (tests/fake_backend.py), a workflow that ends at once."""
    data = {
        "backend": BACKEND,
        "trials": {"output_dir": "runs", "frames_every": frames_every},
        "suites": [
            {
                "suite_name": "fake/easy",
                "task_ids": [0],
                "seeds": [1],
                "workflow_dir": str(write_workflow(pytester.path / "wf", GIVE_UP)),
            }
        ],
        "gate_threshold": 0.0,
    }
    (pytester.path / "bench.yaml").write_text(yaml.safe_dump(data))


def _only_result(pytester, session: int = -1) -> dict:
    run_dirs = sorted((pytester.path / "runs").iterdir())
    (path,) = run_dirs[session].rglob("result.json")
    return json.loads(path.read_text())


@pytest.fixture
def fake_backend_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))


@pytest.mark.usefixtures("fake_backend_on_path")
def test_the_option_overrides_the_config(pytester):
    _fake_config(pytester, frames_every=None)
    assert pytester.runpytest_inprocess("bench.yaml", "--gap-frames", "2").ret == 0
    record = _only_result(pytester)
    slug = "suites__fake__easy__fake__easy__task00__seed001"
    assert record["frames"] == f"frames/{slug}.webp" and record["error"] is None
    run_dir = next((pytester.path / "runs").iterdir())
    assert _open(run_dir / record["frames"])[:2] == ("WEBP", (STRIP_HEIGHT, STRIP_HEIGHT))

    _fake_config(pytester, frames_every=2)
    (pytester.path / "runs").rename(pytester.path / "runs_before")
    assert pytester.runpytest_inprocess("bench.yaml", "--gap-frames", "0").ret == 0
    record = _only_result(pytester)
    assert record["frames"] is None and record["error"] is None
    assert not list((pytester.path / "runs").rglob("*.webp"))

    result = pytester.runpytest_inprocess("bench.yaml", "--gap-frames", "-3")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "argument --gap-frames: '-3': a whole number N >= 0" in result.stderr.str()


@pytest.mark.usefixtures("fake_backend_on_path")
def test_a_trial_asked_for_frames_that_has_none_is_errored(pytester, monkeypatch):
    """Fault injection: a strip writer that writes nothing. The trial ran, but without its
    receipt it is an errored trial with a one-line error, not a result with a silent gap."""
    monkeypatch.setattr(StripWriter, "close", lambda self: 0)
    _fake_config(pytester, frames_every=3)
    result = pytester.runpytest_inprocess("bench.yaml")
    assert result.ret == 1  # an errored trial fails the gate
    record = _only_result(pytester)
    assert record["exit_code"] == 1 and record["frames"] is None
    assert record["error"] == (
        "frames: this trial was asked for a frame strip (frames_every 3, from "
        "trials.frames_every or --gap-frames) but none was written to "
        "frames/suites__fake__easy__fake__easy__task00__seed001.webp"
    )


# -- one real session ------------------------------------------------------------------------------
HOME_THEN_CHECK = {
    "version": 1,
    "name": "home_then_check",
    "start": "home",
    "nodes": {
        "home": {"type": "tool", "skill": "home", "next": "check", "on_error": "check"},
        "check": {"type": "tool", "skill": "check_success", "next": "failed"},
        "failed": {"type": "end", "status": "failure"},
    },
}


@pytest.mark.images
def test_a_libero_session_writes_each_trials_strip_and_names_it(pytester):
    data = {
        "trials": {"output_dir": "runs", "max_steps": 20, "enable_tracing": False},
        "suites": [
            {
                "suite_name": "libero_object",
                "task_ids": [0],
                "seeds": [0],
                "workflow_dir": str(write_workflow(pytester.path / "wf", HOME_THEN_CHECK)),
            }
        ],
        "gate_threshold": 0.0,
    }
    (pytester.path / "bench.yaml").write_text(yaml.safe_dump(data))
    try:
        result = pytester.runpytest_inprocess("bench.yaml", "--gap-frames", "5")
    finally:
        env_pool().close()  # the session's env, pooled in this process
    assert result.ret == 0, result.stdout.str()
    record = _only_result(pytester)
    assert record["error"] is None and record["steps"] > 0
    assert record["frames"] == "frames/suites__libero_object__libero__object__task00__seed000.webp"
    run_dir = next((pytester.path / "runs").iterdir())
    tiles = math.ceil((record["steps"] + 1) / 5)
    # 256 px renders, halved
    assert _open(run_dir / record["frames"])[:2] == ("WEBP", (tiles * STRIP_HEIGHT, STRIP_HEIGHT))
