"""<run dir>/dataset/: the run's episodes as a LeRobot dataset, in its v3.0 layout.

Each scored trial that recorded dataset frames (trials.dataset; sim/dataset_frames.py) becomes
one episode; with `only_success`, only those that succeeded. The layout is LeRobot's own
(lerobot.datasets, codebase v3.0), which `bench/lerobot_read_back.py` opens with its
`LeRobotDataset` class:

    meta/info.json                 fps, features, totals, the path templates below
    meta/stats.json                per feature: min max mean std count q01 q10 q50 q90 q99
    meta/tasks.parquet             the task strings (the index) and their task_index
    meta/episodes/chunk-000/file-000.parquet   one row per episode: its rows, its video span,
                                   its stats; and, ours, `success` and `gap/trial` (its trial)
    data/chunk-000/file-000.parquet            one row per frame
    videos/observation.images.<camera>/chunk-000/file-000.mp4   the episodes back to back

A row is a frame: the observation at control step `frame_index * every` (images upright, as a
LIBERO client sees them, and the 8-D proprio a policy is sent) and `action`, the action the
simulator took at that step. With `every` > 1 (a policy queried every N-th step), `action.chunk`
holds the N actions taken from that frame to the next, and `action.chunk_is_pad` marks the
repeats of the last action that pad the episode's final frame. `next.reward` is the best reward
in the frame's steps, `next.done` is true on an episode's last frame, and `next.success` too if
the episode succeeded. Videos are H.264 (yuv420p, a key frame every 2 frames, as LeRobot encodes
its own for random access) rather than LeRobot's default AV1, which not every decoder reads.

Pure over the run dir's records and files; written beside the destination and renamed into
place, so a reader never sees half a dataset.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_gap.layout import DATASET_DIR, DATASET_STATE, DATASET_VIDEO, inside
from pytest_gap.outputs.hook import hookimpl
from pytest_gap.outputs.lerobot_stats import aggregate, feature_stats, image_stats, stats_columns
from pytest_gap.outputs.lerobot_video import (
    CHUNKS_SIZE,
    VIDEO_FILE_MB,
    VIDEO_PATH,
    VideoFiles,
    read_first_frames,
    video_key,
)

if TYPE_CHECKING:
    import numpy as np

    from pytest_gap.config.document import BenchmarkConfig
    from pytest_gap.results import TrialResult

CODEBASE_VERSION = "v3.0"
ROBOT_TYPE = "panda"
CONTROL_HZ = 20
DATA_FILE_MB = 100  # the data file's bound (this writer writes one: frames are small)
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
INFO_PATH, STATS_PATH, TASKS_PATH = "meta/info.json", "meta/stats.json", "meta/tasks.parquet"
CAMERAS = ("agentview", "wrist")


@dataclass
class Recorded:
    """One trial's dataset recording: `n` rows of its steps, from `frames` frames at every
    `every`-th step."""

    key: str  # the trial dir, relative to the run dir
    result: TrialResult
    every: int
    size: int
    state: np.ndarray  # (frames, 8)
    steps: dict[str, np.ndarray]  # steps.parquet's columns

    @property
    def n_rows(self) -> int:
        return math.ceil(len(self.steps["action"]) / self.every)


@dataclass
class DatasetReport:
    """What `write_dataset` wrote, and the trials it left out with why."""

    path: Path
    episodes: int = 0
    frames: int = 0
    tasks: int = 0
    fps: int = 0
    skipped: dict[str, str] = field(default_factory=dict)

    def line(self) -> str:
        left = f"; {len(self.skipped)} trials left out" if self.skipped else ""
        tasks = "1 task" if self.tasks == 1 else f"{self.tasks} tasks"
        return (
            f"dataset {self.path}: {self.episodes} episodes, {self.frames} frames at "
            f"{self.fps} fps, {tasks}{left}"
        )


def recorded_trials(
    run_dir: Path, results: Mapping[str, TrialResult], only_success: bool = False
) -> tuple[list[Recorded], dict[str, str]]:
    """The trials to write, in the order of their keys, and those left out with why."""
    import numpy as np

    from pytest_gap.sim.step_log import read_steps

    chosen, skipped = [], {}
    for key in sorted(results):
        result, trial_dir = results[key], run_dir / key
        state_file = trial_dir / DATASET_STATE
        if not state_file.is_file():
            continue  # recorded no dataset frames (a trial of a run without trials.dataset)
        if result.errored:
            skipped[key] = "errored: not scored"
        elif only_success and not result.success:
            skipped[key] = "failed (only_success)"
        elif result.steps_file is None or not (run_dir / result.steps_file).is_file():
            skipped[key] = "no steps.parquet: no step ran"
        else:
            with np.load(state_file) as saved:
                every, size = int(saved["every"]), int(saved["size"])
                state = np.asarray(saved["state"], dtype=np.float32)
            recorded = Recorded(
                key, result, every, size, state, read_steps(run_dir / result.steps_file)
            )
            missing = [
                c for c in CAMERAS if not (trial_dir / DATASET_VIDEO.format(camera=c)).is_file()
            ]
            if missing:
                skipped[key] = f"no {', '.join(missing)} video"
            elif len(state) < recorded.n_rows:
                skipped[key] = f"{len(state)} frames recorded, {recorded.n_rows} needed"
            else:
                chosen.append(recorded)
    return chosen, skipped


def _rows(rec: Recorded, episode: int, first_index: int, task_index: int, fps: int) -> dict:
    """The data columns of one episode (module doc)."""
    import numpy as np

    actions = np.asarray(rec.steps["action"], dtype=np.float32).reshape(-1, 7)
    rewards = np.asarray(rec.steps["reward"], dtype=np.float32)
    n, every = rec.n_rows, rec.every
    starts = np.arange(n) * every
    last = n - 1
    columns = {
        "observation.state": rec.state[:n],
        "action": actions[starts],
    }
    if every > 1:
        index = starts[:, None] + np.arange(every)[None, :]
        columns["action.chunk"] = actions[np.minimum(index, len(actions) - 1)]
        columns["action.chunk_is_pad"] = index >= len(actions)
    spans = np.minimum(starts[:, None] + np.arange(every)[None, :], len(rewards) - 1)
    columns["next.reward"] = rewards[spans].max(axis=1).reshape(n, 1)
    done = np.zeros((n, 1), dtype=bool)
    done[last] = True
    columns["next.done"] = done
    columns["next.success"] = done & bool(rec.result.success)
    columns["timestamp"] = (np.arange(n) / fps).astype(np.float32).reshape(n, 1)
    columns["frame_index"] = np.arange(n, dtype=np.int64).reshape(n, 1)
    columns["episode_index"] = np.full((n, 1), episode, dtype=np.int64)
    columns["index"] = (first_index + np.arange(n, dtype=np.int64)).reshape(n, 1)
    columns["task_index"] = np.full((n, 1), task_index, dtype=np.int64)
    return columns


def _features(every: int, size: int, fps: int) -> dict:
    video_info = {
        "video.height": size,
        "video.width": size,
        "video.codec": "h264",
        "video.pix_fmt": "yuv420p",
        "video.is_depth_map": False,
        "video.fps": fps,
        "video.channels": 3,
        "has_audio": False,
    }
    features = {
        video_key(c): {
            "dtype": "video",
            "shape": [size, size, 3],
            "names": ["height", "width", "channels"],
            "info": video_info,
        }
        for c in CAMERAS
    }
    features["observation.state"] = {
        "dtype": "float32",
        "shape": [8],
        "names": [
            *("eef_x", "eef_y", "eef_z", "axis_angle_x", "axis_angle_y", "axis_angle_z"),
            *("finger_left", "finger_right"),
        ],
    }
    arm = ["dx", "dy", "dz", "droll", "dpitch", "dyaw", "gripper"]
    features["action"] = {"dtype": "float32", "shape": [7], "names": arm}
    if every > 1:
        features["action.chunk"] = {"dtype": "float32", "shape": [every, 7], "names": None}
        features["action.chunk_is_pad"] = {"dtype": "bool", "shape": [every], "names": None}
    features["next.reward"] = {"dtype": "float32", "shape": [1], "names": None}
    features["next.done"] = {"dtype": "bool", "shape": [1], "names": None}
    features["next.success"] = {"dtype": "bool", "shape": [1], "names": None}
    features["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
    for name in ("frame_index", "episode_index", "index", "task_index"):
        features[name] = {"dtype": "int64", "shape": [1], "names": None}
    return features


def _arrow_column(values: np.ndarray, dtype: str):
    """A data column as LeRobot stores it: a scalar for shape [1], a fixed-size list for a
    vector, nested lists for a matrix."""
    import pyarrow as pa

    scalar = {"float32": pa.float32(), "int64": pa.int64(), "bool": pa.bool_()}[dtype]
    if values.ndim == 2 and values.shape[1] == 1:
        return pa.array(values[:, 0], type=scalar)
    flat = pa.array(values.reshape(-1), type=scalar)
    if values.ndim == 2:
        return pa.FixedSizeListArray.from_arrays(flat, values.shape[1])
    inner = pa.FixedSizeListArray.from_arrays(flat, values.shape[2])
    return pa.FixedSizeListArray.from_arrays(inner, values.shape[1])


def _one_shape(chosen: list[Recorded], skipped: dict[str, str]) -> list[Recorded]:
    """One dataset has one fps and one image size: the first trial's; others are left out."""
    every, size = chosen[0].every, chosen[0].size
    for rec in chosen:
        if (rec.every, rec.size) != (every, size):
            skipped[rec.key] = f"recorded every {rec.every} at {rec.size} px, not {every} at {size}"
    return [r for r in chosen if (r.every, r.size) == (every, size)]


@dataclass
class _Written:
    """What the episodes loop wrote into the videos and holds for the meta files."""

    episodes: list[dict] = field(default_factory=list)  # meta/episodes rows
    tables: list = field(default_factory=list)  # each episode's data (pyarrow tables)
    stats: list[dict] = field(default_factory=list)  # each episode's feature stats
    tasks: dict[str, int] = field(default_factory=dict)
    frames: int = 0


def _episode_stats(frames_of: dict, columns: dict, features: dict) -> dict:
    stats = {video_key(camera): image_stats(frames) for camera, frames in frames_of.items()}
    for name, values in columns.items():
        flat = values.reshape(len(values), -1) if values.ndim > 2 else values
        found = feature_stats(flat, (0,))
        shape = features[name]["shape"]
        if len(shape) == 2:  # a matrix per row (action.chunk): its stats keep its shape
            found = {k: v if k == "count" else v.reshape(shape) for k, v in found.items()}
        stats[name] = found
    return stats


def _write_episodes(run_dir, chosen, videos, features, fps, skipped) -> _Written:
    """Encode each trial's frames into the dataset's videos; its rows, its meta row, its
    stats. A trial whose recording ffmpeg cannot read is left out, not the dataset."""
    import pyarrow as pa

    done = _Written()
    for rec in chosen:
        n = rec.n_rows
        try:
            frames_of = {
                camera: read_first_frames(
                    run_dir / rec.key / DATASET_VIDEO.format(camera=camera), rec.size, n
                )
                for camera in CAMERAS
            }
        except (OSError, RuntimeError, ValueError) as exc:
            skipped[rec.key] = f"its video could not be read: {exc}"
            continue
        episode, task = len(done.episodes), rec.result.prompt or rec.result.env_prompt or ""
        task_index = done.tasks.setdefault(task, len(done.tasks))
        columns = _rows(rec, episode, done.frames, task_index, fps)
        row = {
            "episode_index": episode,
            "tasks": [task],
            "length": n,
            "data/chunk_index": 0,
            "data/file_index": 0,
            "dataset_from_index": done.frames,
            "dataset_to_index": done.frames + n,
        }
        for camera, frames in frames_of.items():
            chunk, file, start, end = videos[camera].append(frames)
            key = video_key(camera)
            row |= {
                f"videos/{key}/chunk_index": chunk,
                f"videos/{key}/file_index": file,
                f"videos/{key}/from_timestamp": start,
                f"videos/{key}/to_timestamp": end,
            }
        stats = _episode_stats(frames_of, columns, features)
        row |= {"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0}
        row |= {"success": bool(rec.result.success), "gap/trial": rec.key}
        done.episodes.append(row | stats_columns(stats))
        done.stats.append(stats)
        done.tables.append(
            pa.table({k: _arrow_column(v, features[k]["dtype"]) for k, v in columns.items()})
        )
        done.frames += n
    return done


def _write_meta(partial: Path, done: _Written, features: dict, fps: int) -> None:
    """The data file and meta/: episodes, tasks, stats, info."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    data_path = partial / DATA_PATH.format(chunk_index=0, file_index=0)
    data_path.parent.mkdir(parents=True)
    pq.write_table(pa.concat_tables(done.tables), data_path)
    episodes_path = partial / EPISODES_PATH.format(chunk_index=0, file_index=0)
    episodes_path.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(done.episodes), episodes_path)
    # pandas, as LeRobot writes and reads it: the task string is the index
    pd.DataFrame({"task_index": list(done.tasks.values())}, index=list(done.tasks)).to_parquet(
        partial / TASKS_PATH
    )
    total = {name: aggregate([s[name] for s in done.stats]) for name in done.stats[0]}
    (partial / STATS_PATH).write_text(
        json.dumps({k: {n: v.tolist() for n, v in s.items()} for k, s in total.items()}, indent=4)
    )
    info = {
        "codebase_version": CODEBASE_VERSION,
        "robot_type": ROBOT_TYPE,
        "total_episodes": len(done.episodes),
        "total_frames": done.frames,
        "total_tasks": len(done.tasks),
        "chunks_size": CHUNKS_SIZE,
        "data_files_size_in_mb": DATA_FILE_MB,
        "video_files_size_in_mb": VIDEO_FILE_MB,
        "fps": fps,
        "splits": {"train": f"0:{len(done.episodes)}"},
        "data_path": DATA_PATH,
        "video_path": VIDEO_PATH,
        "features": features,
    }
    (partial / INFO_PATH).write_text(json.dumps(info, indent=4))


def write_dataset(
    run_dir: Path,
    results: Mapping[str, TrialResult],
    out: Path,
    *,
    only_success: bool = False,
) -> DatasetReport:
    """Write the recorded trials of `results` (keyed by trial dir) as a LeRobot dataset at
    `out`, replacing one there; the report says what went in and what was left out."""
    chosen, skipped = recorded_trials(run_dir, results, only_success)
    report = DatasetReport(path=out, skipped=skipped)
    if not chosen:
        return report
    chosen = _one_shape(chosen, skipped)
    every, size = chosen[0].every, chosen[0].size
    fps = CONTROL_HZ // every
    features = _features(every, size, fps)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    videos = {c: VideoFiles(partial, c, fps, size) for c in CAMERAS}
    try:
        done = _write_episodes(run_dir, chosen, videos, features, fps, skipped)
    finally:
        for files in videos.values():
            files.close()
    if not done.episodes:
        shutil.rmtree(partial)
        return report
    _write_meta(partial, done, features, fps)
    if out.exists():
        shutil.rmtree(out)
    partial.rename(out)
    report.episodes, report.frames, report.fps = len(done.episodes), done.frames, fps
    report.tasks = len(done.tasks)
    return report


@hookimpl
def pytest_gap_write_outputs(
    run_dir: Path, results: dict[str, TrialResult], benchmark: BenchmarkConfig
) -> None:
    dataset = benchmark.trials.dataset
    if dataset is not None:
        write_dataset(
            run_dir, results, inside(run_dir, DATASET_DIR), only_success=dataset.only_success
        )
