"""A fake simulator backend (a test double): the harness's plugin, plan, report and executor
logic run on it in seconds, without LIBERO, MuJoCo or robosuite.

A config names it by import string, `backend: fake_backend:FakeBackend`, with tests/ on the path:
it lands without an edit of pytest_gap, as a third-party backend would. It is deterministic:
- suites `fake_easy` and `fake_hard`, N_TASKS tasks each; family `fake` with variations `easy`
  and `hard` (suite fake_<variation>), not generated;
- seed s starts from init state s mod N_INIT_STATES (its `init_state_digest` hashes the suite,
  task and init state, as a real backend's names its scene); on fake_easy the episode succeeds iff
  s % 3 != 0, once GOAL_STEPS counted steps were taken; on fake_hard it never does. The goal has
  two conjuncts, ("moved",) holding after the first step and ("reached",) on success, so a
  failed episode that moved has completion 0.5;
- its envs have no scene (`scene is None`): only scene-free skills run (check_success,
  read_task, run_policy, and fake_conftest.py's `idle`).
Faults on request, read from the environment (xdist workers inherit it):
- GAP_TEST_FAKE_STEP_S: seconds each counted step costs (default 0; reset's settling is free);
- GAP_TEST_FAKE_CRASH / GAP_TEST_FAKE_KILL: comma-separated `task:seed` pairs whose reset kills the
  process: os._exit(139), like a segfault / SIGKILL, like the OOM killer or a `kill -9`;
- GAP_TEST_FAKE_HANG: `task:seed` pairs whose first step (after reset, so the record has its init
  state) sleeps until interrupted (in Python, so the signal watchdog can stop it).
Records, for tests that check what each process did:
- GAP_TEST_FAKE_ENVS: a file each make_env appends a JSON line to: the pid, suite, task, the EGL
  device the env was built for, and the process's CUDA_VISIBLE_DEVICES/MUJOCO_EGL_DEVICE_ID then;
- with a `video` path, reset starts a recording and finish_video writes one placeholder frame
  per step to it (not an mp4: the harness only links and names the file);
- with `frames`, every `frames.every`-th frame goes to the harness's own StripWriter (a real
  WebP): 16x16 grey tiles, frame i (the settled scene 0, then one per step) of shade 10 * i.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np

from pytest_gap.errors import EpisodeError, SimInputError
from pytest_gap.sim.backend import (
    EnvOptions,
    EpisodeInfo,
    FrameStrip,
    Observation,
    StepResult,
    Variation,
    state_digest,
)
from pytest_gap.sim.video import StripWriter

N_TASKS = 4
N_INIT_STATES = 5
GOAL_STEPS = 3
MAX_STEPS = 20
SUITES = ("fake_easy", "fake_hard")


def _pairs(var: str) -> set[tuple[int, int]]:
    raw = os.environ.get(var, "")
    return {tuple(int(v) for v in p.split(":")) for p in raw.split(",") if p.strip()}


class FakeEnv:
    def __init__(self, suite: str, task_id: int, options: EnvOptions, egl_device: int | None):
        self.suite, self.task_id, self.options = suite, task_id, options
        self.egl_device = egl_device
        self.max_steps = options.max_steps or MAX_STEPS
        self.scene = None
        self._episode: EpisodeInfo | None = None
        self._steps = 0
        self._goal_at: int | None = None
        self._video: Path | None = None
        self._strip: tuple[StripWriter, int] | None = None
        self._hang = False
        self.closed = False

    @property
    def episode(self) -> EpisodeInfo:
        if self._episode is None:
            raise EpisodeError(f"{self.suite} task {self.task_id}: call reset(seed) first")
        return self._episode

    @property
    def steps(self) -> int:
        return self._steps

    def reset(
        self,
        seed: int,
        *,
        variation: Variation | None = None,
        video: str | Path | None = None,
        frames: FrameStrip | None = None,
    ) -> Observation:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise SimInputError(f"seed {seed!r}: seeds are integers >= 0")
        if (self.task_id, seed) in _pairs("GAP_TEST_FAKE_CRASH"):
            os._exit(139)
        if (self.task_id, seed) in _pairs("GAP_TEST_FAKE_KILL"):
            os.kill(os.getpid(), signal.SIGKILL)
        self._hang = (self.task_id, seed) in _pairs("GAP_TEST_FAKE_HANG")
        self._episode, self._steps = None, 0
        self._video = Path(video) if video is not None else None
        self._strip = (StripWriter(frames.path), frames.every) if frames is not None else None
        succeeds = self.suite == "fake_easy" and seed % 3 != 0
        self._goal_at = GOAL_STEPS if succeeds else None
        self._episode = EpisodeInfo(
            seed=seed,
            init_state=seed % N_INIT_STATES,
            prompt=FakeBackend().task_prompt(self.suite, self.task_id),
            goal=(("moved",), ("reached",)),
            # the fake's "scene": its suite, task and init state
            init_state_digest=state_digest(
                np.array([SUITES.index(self.suite), self.task_id, seed % N_INIT_STATES], float)
            ),
        )
        self._record()
        return self.observe()

    def step(self, action: Any) -> StepResult:
        act = np.asarray(action, dtype=np.float64).reshape(-1)
        if act.shape != (7,) or not np.all(np.isfinite(act)):
            raise SimInputError(f"action {action!r}: expected 7 finite numbers")
        if self._steps >= self.max_steps:
            raise EpisodeError(f"step limit {self.max_steps} reached; reset() first")
        _ = self.episode
        while self._hang:
            time.sleep(0.05)
        self._pause()
        self._steps += 1
        self._record()
        success = self.success()
        return StepResult(
            obs=self.observe(),
            success=success,
            completion=self.completion(),
            steps=self._steps,
            truncated=not success and self._steps >= self.max_steps,
        )

    def observe(self, cameras: tuple[str, ...] | None = None) -> Observation:
        shape = (self.options.height, self.options.width, 3)
        return Observation(
            images={c: np.zeros(shape, np.uint8) for c in cameras or self.options.cameras},
            state=np.zeros(8, np.float32),
            prompt=self.episode.prompt,
        )

    def goal_status(self) -> list[bool]:
        _ = self.episode
        reached = self._goal_at is not None and self._steps >= self._goal_at
        return [self._steps >= 1, reached]

    def success(self) -> bool:
        return all(self.goal_status())

    def completion(self) -> float:
        status = self.goal_status()
        return sum(status) / len(status)

    def _record(self) -> None:
        if self._strip is not None and self._steps % self._strip[1] == 0:
            self._strip[0].append(np.full((16, 16, 3), min(10 * self._steps, 255), np.uint8))

    def finish_video(self) -> int:
        """Close the recordings reset started: the strip, and the video (one placeholder line
        per step); the video's frame count, 0 without one."""
        if self._strip is not None:
            strip, self._strip = self._strip[0], None
            strip.close()
        if self._video is None:
            return 0
        frames = self._steps + 1  # the reset frame, then one per step
        self._video.write_text("frame\n" * frames)
        self._video = None
        return frames

    def close(self) -> None:
        self.closed = True

    def _pause(self) -> None:
        cost = float(os.environ.get("GAP_TEST_FAKE_STEP_S") or 0)
        if cost > 0:
            time.sleep(cost)


class FakeFamily:
    name = "fake"

    def variations(self) -> list[str]:
        return ["easy", "hard"]

    def resolve(self, variation: str) -> Variation:
        return Variation(family=self.name, variation=variation, suite=f"fake_{variation}")


class FakeBackend:
    name = "fake"

    def suites(self) -> list[str]:
        return list(SUITES)

    def unavailable(self) -> dict[str, str]:
        return {"fake_broken": "it is broken on purpose"}

    def _check(self, suite: str, task_id: int | None = None) -> None:
        if suite not in SUITES:
            raise SimInputError(f"unknown fake suite {suite!r}; use one of {', '.join(SUITES)}")
        if task_id is not None and not 0 <= task_id < N_TASKS:
            raise SimInputError(f"task id {task_id} for suite {suite}: valid ids are 0..3")

    def n_tasks(self, suite: str) -> int:
        self._check(suite)
        return N_TASKS

    def max_steps(self, suite: str) -> int:
        self._check(suite)
        return MAX_STEPS

    def task_prompt(self, suite: str, task_id: int) -> str:
        self._check(suite, task_id)
        return f"pick up the block {task_id} and place it in the bin"

    def n_init_states(self, suite: str, task_id: int) -> int:
        self._check(suite, task_id)
        return N_INIT_STATES

    def families(self) -> dict[str, FakeFamily]:
        return {"fake": FakeFamily()}

    def make_env(
        self,
        suite: str,
        task_id: int,
        options: EnvOptions | None = None,
        egl_device: int | None = None,
    ) -> FakeEnv:
        self._check(suite, task_id)
        log = os.environ.get("GAP_TEST_FAKE_ENVS")
        if log:
            pinned = ("CUDA_VISIBLE_DEVICES", "MUJOCO_EGL_DEVICE_ID")
            record = {"pid": os.getpid(), "suite": suite, "task": task_id}
            record |= {"egl_device": egl_device, "environ": {k: os.environ.get(k) for k in pinned}}
            with open(log, "a") as out:
                out.write(json.dumps(record) + "\n")
        return FakeEnv(suite, task_id, options or EnvOptions(), egl_device)


class ControlledFakeFamily(FakeFamily):
    """`fake` whose `hard` declares `easy` as its matched control arm (the same tasks and
    seeds; init states differ by suite, as a perturbation's do)."""

    def control(self, variation: str) -> tuple[str, str] | None:
        return ("fake", "easy") if variation == "hard" else None


class ControlledFakeBackend(FakeBackend):
    def families(self) -> dict[str, FakeFamily]:
        return {"fake": ControlledFakeFamily()}
