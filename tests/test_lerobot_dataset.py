"""A run's episodes as a LeRobot dataset (trials.dataset, outputs/lerobot.py, `gap dataset`):
a real LIBERO session recorded, its dataset checked against the v3.0 layout's own definition
(LeRobot's lerobot/datasets: meta/info.json, tasks, episodes, data, videos, stats), against the
trial's own records, and against what a LIBERO client observes. LeRobot's own LeRobotDataset
reads it in bench/lerobot_read_back.py (an environment of its own: lerobot needs another
torch)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from pytest_gap.config.document import BenchmarkConfig, parse_config
from pytest_gap.config.messages import ConfigError
from pytest_gap.config.remote import remote_problems
from pytest_gap.outputs.lerobot_video import read_video
from pytest_gap.results import scan_results
from pytest_gap.sim.backend import DatasetFrames, EnvOptions
from pytest_gap.sim.dataset_frames import proprio
from pytest_gap.sim.libero import make_env
from pytest_gap.sim.step_log import read_steps

ROOT = Path(__file__).resolve().parents[1]
GAP = shutil.which("gap", path=str(Path(sys.executable).parent)) or "gap"
SIZE, EVERY = 32, 5
WORKFLOW = ROOT / "examples" / "workflows" / "pick_place"
# task 0's scene holds the cream cheese too: asked for it, pick_place moves it and the goal
# (the alphabet soup in the basket) fails, an episode as long as a success
OTHER_PROMPT = "pick up the cream cheese and place it in the basket"
# The v3.0 layout (LeRobot's lerobot/datasets/utils.py and lerobot_dataset.py)
INFO_KEYS = {
    "codebase_version",
    "robot_type",
    "total_episodes",
    "total_frames",
    "total_tasks",
    "chunks_size",
    "data_files_size_in_mb",
    "video_files_size_in_mb",
    "fps",
    "splits",
    "data_path",
    "video_path",
    "features",
}
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
DEFAULT_FEATURES = {
    "timestamp": "float32",
    "frame_index": "int64",
    "episode_index": "int64",
    "index": "int64",
    "task_index": "int64",
}
VIDEO_INFO = {
    "video.height",
    "video.width",
    "video.codec",
    "video.pix_fmt",
    "video.is_depth_map",
    "video.fps",
    "video.channels",
    "has_audio",
}
STATS = {"min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99"}
CAMERAS = ("observation.images.agentview", "observation.images.wrist")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One session over libero_object task 0: two episodes that succeed and one asked for
    another object (it fails), both cameras at SIZE px every EVERY-th step."""
    where = tmp_path_factory.mktemp("dataset")
    config = {
        "trials": {
            "output_dir": "runs",
            "task_timeout_secs": 600,
            "dataset": {"image_size": SIZE, "every": EVERY},
        },
        "suites": [
            {"suite_name": "libero_object", "task_ids": [0], "seeds": [0, 1]},
            {
                "suite_name": "libero_object",
                "task_ids": [0],
                "seeds": [2],
                "task_prompts": {0: OTHER_PROMPT},
            },
        ],
        "gate_threshold": 0.0,
    }
    for entry in config["suites"]:
        entry["workflow_dir"] = str(WORKFLOW)
    (where / "bench.yaml").write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "bench.yaml", "-p", "no:cacheprovider", "-q"],
        cwd=where,
        capture_output=True,
        text=True,
    )
    (run,) = (where / "runs").iterdir()
    results = scan_results(run)
    assert len(results) == 3, done.stdout + done.stderr
    return run, results


def _frames(path: Path) -> np.ndarray:
    return read_video(path, SIZE)


def test_a_recorded_run_is_a_lerobot_v3_dataset_of_its_episodes(recorded):
    run, results = recorded
    root = run / "dataset"
    info = json.loads((root / "meta/info.json").read_text())
    assert set(info) == INFO_KEYS
    assert (info["codebase_version"], info["fps"], info["robot_type"]) == (
        "v3.0",
        20 // EVERY,
        "panda",
    )
    assert (info["data_path"], info["video_path"]) == (DATA_PATH, VIDEO_PATH)
    features = info["features"]
    for name, dtype in DEFAULT_FEATURES.items():
        assert features[name] == {"dtype": dtype, "shape": [1], "names": None}
    for camera in CAMERAS:
        assert features[camera]["dtype"] == "video"
        assert features[camera]["shape"] == [SIZE, SIZE, 3]
        assert set(features[camera]["info"]) == VIDEO_INFO
        assert features[camera]["info"]["video.fps"] == info["fps"]
    assert features["observation.state"]["shape"] == [8]
    assert features["action"]["shape"] == [7]
    assert features["action.chunk"]["shape"] == [EVERY, 7]

    episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    data = pq.read_table(root / DATA_PATH.format(chunk_index=0, file_index=0))
    assert [c for c in data.column_names if c in DEFAULT_FEATURES] == list(DEFAULT_FEATURES)
    assert set(data.column_names) == {n for n, f in features.items() if f["dtype"] != "video"}
    assert str(data.schema.field("observation.state").type) == "fixed_size_list<element: float>[8]"
    rows = data.to_pydict()
    # every trial an episode, in order; the totals and the split count them
    assert [e["gap/trial"] for e in episodes] == sorted(results)
    assert info["total_episodes"] == len(episodes) == 3
    assert info["splits"] == {"train": "0:3"}
    assert info["total_frames"] == data.num_rows == sum(e["length"] for e in episodes)
    assert rows["index"] == list(range(data.num_rows))

    tasks = pd.read_parquet(root / "meta/tasks.parquet")  # as LeRobot reads it
    assert info["total_tasks"] == len(tasks) == 2
    assert OTHER_PROMPT in tasks.index
    fps, start, seconds = info["fps"], 0, 0.0
    for e in episodes:
        result = results[e["gap/trial"]]
        n = e["length"]
        taken = result.bringup_steps + result.steps  # every control step, the bring-up's too
        assert n == -(-taken // EVERY)  # a frame at steps 0, EVERY, ... < taken
        assert (e["dataset_from_index"], e["dataset_to_index"]) == (start, start + n)
        assert e["tasks"] == [result.prompt]
        assert e["success"] == result.success
        own = slice(start, start + n)
        assert set(rows["task_index"][own]) == {int(tasks.loc[result.prompt, "task_index"])}
        assert rows["frame_index"][own] == list(range(n))
        assert np.allclose(rows["timestamp"][own], np.arange(n) / fps)
        assert rows["next.done"][own] == [False] * (n - 1) + [True]
        assert rows["next.success"][own][-1] == result.success
        # the actions are the trial's own, step by step
        steps = read_steps(run / result.steps_file)
        actions = np.asarray(steps["action"])
        assert np.array_equal(np.asarray(rows["action"][own]), actions[::EVERY])
        chunks = np.asarray(rows["action.chunk"][own]).reshape(-1, 7)
        pad = np.asarray(rows["action.chunk_is_pad"][own]).reshape(-1)
        assert np.array_equal(chunks[~pad], actions)
        assert pad.sum() == n * EVERY - len(actions)
        for camera in CAMERAS:
            assert e[f"videos/{camera}/from_timestamp"] == pytest.approx(seconds)
            assert e[f"videos/{camera}/to_timestamp"] == pytest.approx(seconds + n / fps)
            assert (e[f"videos/{camera}/chunk_index"], e[f"videos/{camera}/file_index"]) == (0, 0)
        start, seconds = start + n, seconds + n / fps
    assert {e["success"] for e in episodes} == {True, False}

    # the videos: every frame of every episode, near the trial's own (lossless) recording
    for camera, recorded_name in zip(CAMERAS, ("agentview", "wrist"), strict=True):
        video = _frames(root / VIDEO_PATH.format(video_key=camera, chunk_index=0, file_index=0))
        assert video.shape == (data.num_rows, SIZE, SIZE, 3)
        for e in episodes:
            own = _frames(run / e["gap/trial"] / f"dataset_{recorded_name}.mp4")[: e["length"]]
            span = video[e["dataset_from_index"] : e["dataset_to_index"]]
            assert np.abs(span.astype(int) - own).mean() < 3.0  # H.264 at crf 18

    stats = json.loads((root / "meta/stats.json").read_text())
    for name, feature in features.items():
        assert set(stats[name]) == STATS, name
        assert stats[name]["count"] == [data.num_rows]
        if feature["dtype"] == "video":
            assert np.asarray(stats[name]["mean"]).shape == (3, 1, 1)
            assert 0.0 <= np.min(stats[name]["min"]) <= np.max(stats[name]["max"]) <= 1.0
    states = np.asarray(rows["observation.state"])
    assert np.allclose(stats["observation.state"]["min"], states.min(axis=0), atol=1e-6)
    assert np.allclose(stats["observation.state"]["mean"], states.mean(axis=0), atol=1e-5)


def test_a_dataset_frame_is_what_a_libero_client_observes(recorded):
    """Frame 0 of seed 0's episode is the scene after settling as LIBERO's OffScreenRenderEnv
    renders it for a client (env.libero_obs), upright, and its state is what a policy is
    sent with it."""
    run, _ = recorded
    root = run / "dataset"
    data = pq.read_table(root / DATA_PATH.format(chunk_index=0, file_index=0)).to_pydict()
    first = _frames(root / VIDEO_PATH.format(video_key=CAMERAS[0], chunk_index=0, file_index=0))[0]
    with make_env("libero_object", 0, EnvOptions(max_steps=10)) as env:
        env.reset(0)
        seen = env.libero_obs(SIZE)
    assert np.abs(first.astype(int) - seen["agentview_image"][::-1]).mean() < 3.0
    assert np.abs(first.astype(int) - seen["agentview_image"]).mean() > 10.0  # not upside down
    assert np.allclose(data["observation.state"][0], proprio(seen), atol=1e-6)


def test_recording_a_dataset_changes_no_episode(tmp_path):
    with make_env("libero_object", 0, EnvOptions(max_steps=20)) as env:
        actions = np.random.default_rng(3).uniform(-0.5, 0.5, (12, 7))
        trajectories = []
        for dataset in (None, DatasetFrames(dir=tmp_path, size=SIZE, every=2)):
            env.reset(4, dataset=dataset)
            trajectories.append([env.step(a).obs.state for a in actions])
            env.finish_video()
        assert np.array_equal(np.asarray(trajectories[0]), np.asarray(trajectories[1]))
        saved = np.load(tmp_path / "dataset_state.npz")
        assert saved["state"].shape == (7, 8) and int(saved["every"]) == 2  # steps 0, 2, .., 12
        assert _frames(tmp_path / "dataset_wrist.mp4").shape == (7, SIZE, SIZE, 3)


def test_gap_dataset_writes_only_the_successes_on_request(recorded, tmp_path):
    run, results = recorded
    out = tmp_path / "demos"

    def gap_dataset(*args):
        return subprocess.run(
            [GAP, "dataset", str(run), "--out", str(out), *args], capture_output=True, text=True
        )

    done = gap_dataset("--only-success")
    assert done.returncode == 0, done.stderr
    failed = [k for k, r in results.items() if not r.success]
    assert [f"gap dataset: left out {k}: failed (only_success)" for k in failed] == (
        done.stderr.splitlines()
    )
    episodes = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [e["gap/trial"] for e in episodes] == sorted(k for k, r in results.items() if r.success)
    info = json.loads((out / "meta/info.json").read_text())
    assert (info["total_episodes"], info["total_tasks"]) == (2, 1)
    assert done.stdout.startswith(f"dataset {out}: 2 episodes, {info['total_frames']} frames")
    # an existing dataset is replaced only when asked
    again = gap_dataset()
    assert again.returncode == 2 and again.stderr.count("\n") == 1
    assert "--force" in again.stderr
    assert gap_dataset("--force").returncode == 0
    assert json.loads((out / "meta/info.json").read_text())["total_episodes"] == 3
    assert not out.with_name("demos.partial").exists()


def test_a_run_that_recorded_no_dataset_says_how_to_record_one(tmp_path):
    run = tmp_path / "20260101_000000"
    run.mkdir()
    (run / "summary.json").write_text("{}")
    done = subprocess.run(
        [GAP, "dataset", str(run), "--out", str(tmp_path / "d")], capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr
    assert "trials.dataset" in done.stderr and done.stderr.count("\n") == 1


def test_a_dataset_setting_a_user_can_get_wrong_is_one_line(tmp_path):
    base = {"suites": [{"suite_name": "libero_object", "task_ids": [0], "workflow_dir": "."}]}
    bad = {**base, "trials": {"dataset": {"every": 3}}}
    with pytest.raises(ConfigError) as caught:
        parse_config(bad, "bench.yaml", base=tmp_path)
    (line,) = [p for p in caught.value.problems if p.startswith("trials.")]
    assert line.startswith("trials.dataset.every: ") and "use one of 1, 2, 4, 5, 10, 20" in line
    submitted = {**base, "trials": {"dataset": {"image_size": 64}}}
    (problem,) = [p for p in remote_problems(submitted, BenchmarkConfig) if "dataset" in p]
    assert problem.startswith("trials.dataset: not allowed in a submitted config")
