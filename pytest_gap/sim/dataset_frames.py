"""One episode's frames for a dataset (sim/backend.py DatasetFrames): both cameras losslessly,
at every `every`-th step, and the proprio state each frame shows.

The frames are what a LIBERO client observes (`LiberoEnv.libero_obs`: the observation instant,
4x MSAA), turned upright; the state is what a policy is sent with them (eef xyz, the hand's
axis-angle, the two finger joints). Lossless (libx264rgb at qp 0, exact RGB) because the
dataset writer (outputs/lerobot.py) re-encodes them once, at its own quality: a lossy copy
here would be encoded twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pytest_gap.layout import DATASET_STATE, DATASET_VIDEO
from pytest_gap.sim.video import VideoWriter

if TYPE_CHECKING:
    from pytest_gap.sim.backend import DatasetFrames

# The dataset's camera -> the key of its image in a LIBERO observation dict
CAMERAS = {"agentview": "agentview_image", "wrist": "robot0_eye_in_hand_image"}


def proprio(obs: dict[str, np.ndarray]) -> np.ndarray:
    """The 8-D state of a LIBERO observation dict as LIBERO's clients compute it (openpi's
    example, policies/formats.py): eef xyz, robosuite's axis-angle, the finger joints."""
    from robosuite.utils.transform_utils import quat2axisangle

    return np.concatenate(
        [
            obs["robot0_eef_pos"],
            quat2axisangle(np.array(obs["robot0_eef_quat"], copy=True)),  # it clips in place
            obs["robot0_gripper_qpos"],
        ]
    ).astype(np.float32)


class DatasetRecorder:
    """Appends one LIBERO observation dict per frame; `close` writes the state file and
    returns the frame count."""

    def __init__(self, frames: DatasetFrames):
        self.size, self.every = frames.size, frames.every
        frames.dir.mkdir(parents=True, exist_ok=True)
        self.state_path = frames.dir / DATASET_STATE
        self._videos = {
            camera: VideoWriter(frames.dir / DATASET_VIDEO.format(camera=camera), lossless=True)
            for camera in CAMERAS
        }
        self._states: list[np.ndarray] = []

    def append(self, obs: dict[str, np.ndarray]) -> None:
        for camera, key in CAMERAS.items():
            self._videos[camera].append(obs[key][::-1])  # robosuite stores them upside down
        self._states.append(proprio(obs))

    def close(self) -> int:
        videos, self._videos = self._videos, {}
        counts = {writer.close() for writer in videos.values()}
        if videos:
            np.savez(
                self.state_path,
                state=np.asarray(self._states, dtype=np.float32).reshape(-1, 8),
                every=self.every,
                size=self.size,
            )
        return counts.pop() if len(counts) == 1 else 0
