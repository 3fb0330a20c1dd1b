"""The LIBERO connector: one in-process LIBERO env per (suite, task), reset per seed.

Protocol (LIBERO's own evaluation, as vla-eval and openpi run it):
- seed s -> init state s mod n_init_states; NumPy's global RNG, from which LIBERO draws the
  fixture jitter (cabinets, stoves, racks move up to ~2 cm at every reset), is seeded with s
  itself just before the reset. So seed s is one scene whatever ran before it, in any process;
  s and s + n_init_states share the init state (the free objects and the arm) but not the
  jitter. openpi and vla-eval seed once per env (seed 7) and hard-reset, so their jitter for an
  episode depends on how many resets came before it; a hard reset seeded with s draws exactly
  the jitter this soft reset draws (tests/test_scene_determinism.py), which is how the
  vla-eval backend gives the same scene for the same seed;
- 10 settle steps with the no-op action (gripper open) before control; they are not counted;
- at most `max_steps` control steps (spatial 220, object 280, goal 300, libero_10 520,
  libero_90 400) unless overridden;
- success is LIBERO's goal check; completion is the fraction of the goal's conjuncts that hold.

Observations follow the project conventions: `images` upright HWC uint8 keyed by the requested
camera names, `state` 8-D (grip-site position 3, hand orientation as axis-angle 3, finger qpos 2),
`prompt`. Actions are LIBERO's 7-D OSC_POSE deltas (xyz, axis-angle, gripper -1 open / +1 close).

Resets are soft (the compiled model is kept) and made exact: a soft reset leaves only the
gripper's stateful command filter behind, which is cleared here. The tests check that a reused
env follows the same trajectory as a fresh one, bit for bit.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_gap.errors import EpisodeError, SimInputError, VideoError
from pytest_gap.sim.backend import (  # re-exported: the data types used to live here
    SETTLE_STEPS,
    DatasetFrames,
    EnvOptions,
    EpisodeInfo,
    FrameStrip,
    Observation,
    Predicate,
    StepResult,
    jitter_seed,
    scene_digest,
    state_digest,
)
from pytest_gap.sim.dataset_frames import DatasetRecorder
from pytest_gap.sim.gl import ensure_gl_backend, import_robosuite_quietly
from pytest_gap.sim.render import resolve_camera
from pytest_gap.sim.scene import SceneView
from pytest_gap.sim.scene_cache import compiled_scenes, scene_cache_from_env
from pytest_gap.sim.suites import SuiteSpec, TaskSpec, get_suite
from pytest_gap.sim.video import StripWriter, VideoWriter

if TYPE_CHECKING:
    from pytest_gap.sim.variations import Perturbation, Variation

__all__ = [
    "SETTLE_STEPS",
    "EnvOptions",
    "EpisodeInfo",
    "LiberoEnv",
    "Observation",
    "Predicate",
    "StepResult",
    "make_env",
]

SAMPLED_SCENE = "gap_sampled_scene"  # our robosuite observable (see LiberoEnv.__init__)
# The MjData frames that a camera render (mjv_updateScene) reads.
RENDERED_FRAMES = (
    "xpos",
    "xmat",
    "geom_xpos",
    "geom_xmat",
    "site_xpos",
    "site_xmat",
    "cam_xpos",
    "cam_xmat",
    "light_xpos",
    "light_xdir",
)
LIBERO_CAMERA_SIZE = 256  # what openpi's and vla-eval's LIBERO clients render at
NOOP_ACTION = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0])
CONTROL_HZ = 20


def quat_xyzw_to_axis_angle(quat: np.ndarray) -> np.ndarray:
    x, y, z, w = (float(v) for v in quat)
    w = min(max(w, -1.0), 1.0)
    den = np.sqrt(max(1.0 - w * w, 0.0))
    if den < 1e-10:
        return np.zeros(3)
    return np.array([x, y, z]) * (2.0 * np.arccos(w) / den)


def _scene_observable(raw):
    """A robosuite observable of the frames a camera render reads, at the control rate: it is
    sampled at the same substep, from the same (pre-integration) kinematics, as LIBERO's camera
    and proprio observables. LIBERO scenes have no tendons, flexes or skins to add."""
    from robosuite.utils.observables import Observable, sensor

    data = raw.sim.data._data

    @sensor(modality="gap")
    def sampled_scene(obs_cache):
        return np.concatenate([getattr(data, name).ravel() for name in RENDERED_FRAMES])

    return Observable(name=SAMPLED_SCENE, sensor=sampled_scene, sampling_rate=raw.control_freq)


@dataclass
class _Recording:
    """One sink of the episode's frames: which cameras it records side by side, and how often.
    Frame i is the scene after i counted steps (0: after settling); it is recorded when
    i % every == 0."""

    sink: VideoWriter | StripWriter
    cameras: dict[str, int]  # name -> MuJoCo camera id
    every: int = 1


@contextlib.contextmanager
def fresh_property_samplers():
    """While open, every LIBERO env keeps one open/close (and on/off) sampler per object, as a
    freshly built env has. LIBERO's `_setup_placement_initializer` appends them again at every
    hard reset (which rebuilds the model) and never clears them: after k hard resets an episode
    draws k extra numbers from NumPy's RNG before it places the fixtures, so even a reseeded env
    jitters a seed's fixtures by how many episodes it ran (libero_spatial task 4: its drawer's
    closed state). Soft resets, as this module's envs make, never add them; an env that
    hard-resets (vla-eval's) needs this to draw the jitter the seed alone decides."""
    from libero.libero.envs.bddl_base_domain import BDDLBaseDomain

    original = BDDLBaseDomain.__dict__["_setup_placement_initializer"]

    def setup_placement_initializer(self, mujoco_arena):
        self.object_property_initializers = []
        return original(self, mujoco_arena)

    BDDLBaseDomain._setup_placement_initializer = setup_placement_initializer
    try:
        yield
    finally:
        BDDLBaseDomain._setup_placement_initializer = original


def _quiet():
    """LIBERO and robosuite print progress to stdout; keep it out of test and bench output."""
    return contextlib.redirect_stdout(io.StringIO())


class LiberoEnv:
    """A LIBERO task env. Create once, then `reset(seed)` for every episode."""

    def __init__(
        self, task: TaskSpec, options: EnvOptions | None = None, egl_device: int | None = None
    ):
        """`egl_device`: the EGL device its cameras render on under MUJOCO_GL=egl (None: the
        process's default, MUJOCO_EGL_DEVICE_ID); unused by other GL backends."""
        self.task = task
        self.egl_device = egl_device
        self.suite: SuiteSpec = get_suite(task.suite)
        self.options = options or EnvOptions()
        self.max_steps = self.options.max_steps or self.suite.max_steps
        ensure_gl_backend()
        import_robosuite_quietly()
        from libero.libero.envs.env_wrapper import ControlEnv

        with _quiet(), compiled_scenes(scene_cache_from_env()):
            self._control = ControlEnv(
                bddl_file_name=str(task.bddl_file),
                has_renderer=False,
                has_offscreen_renderer=False,  # cameras render through SceneView on demand
                use_camera_obs=False,
                camera_names=[],
                ignore_done=True,  # episode length is this class's business
                horizon=10**9,
                hard_reset=False,
            )
        self.raw = self._control.env
        model = self.raw.sim.model._model
        model.vis.quality.offsamples = 4 if self.options.multisample else 0
        self.scene = SceneView(self.raw, egl_device)
        self._cameras = {c: resolve_camera(model, c) for c in self.options.cameras}
        self._steps = 0
        self._episode: EpisodeInfo | None = None
        self._recordings: list[_Recording] = []
        self._dataset: DatasetRecorder | None = None
        # robosuite's observation dict from the last set_init_state / step. robosuite samples
        # its observables once per control step, one physics substep before the step's end, from
        # kinematics computed before that substep's integration: what LIBERO hands a policy lags
        # the sim's final state. An observable of our own, sampled with them, keeps the frames
        # of that instant so that `libero_obs` renders what LIBERO's cameras rendered.
        self._robosuite_obs: dict[str, np.ndarray] = {}
        self._sampled_data = None  # scratch MjData for that scene
        self.raw.add_observable(_scene_observable(self.raw))
        self._closed = False

    # -- episodes ----------------------------------------------------------------------------
    @property
    def episode(self) -> EpisodeInfo:
        if self._episode is None:
            raise EpisodeError(
                f"{self.task.suite} task {self.task.task_id}: call reset(seed) first"
            )
        return self._episode

    @property
    def steps(self) -> int:
        return self._steps

    @property
    def goal(self) -> tuple[Predicate, ...]:
        return self.episode.goal

    def reset(
        self,
        seed: int,
        *,
        variation: Variation | None = None,
        video: str | Path | None = None,
        video_wrist: bool = False,
        frames: FrameStrip | None = None,
        dataset: DatasetFrames | None = None,
    ) -> Observation:
        """Start an episode: init state for `seed`, the variation's perturbation, settle steps.

        With `video`, an mp4 of this episode only is written there: the first frame shows the
        scene after settling, then one frame per control step. With `frames`, a sprite strip of
        every `frames.every`-th of those agentview frames (sim/backend.py FrameStrip); only
        those steps render for it. With `dataset`, both cameras and the proprio state at every
        frame (sim/dataset_frames.py). All are finalised by the next reset, `finish_video()` or
        `close()`.
        """
        self._check_open()
        if variation is not None and variation.suite != self.task.suite:
            raise SimInputError(
                f"variation {variation.family}/{variation.variation} runs on suite "
                f"{variation.suite}, but this env is {self.task.suite}; create the env for "
                f"{variation.suite}"
            )
        self.finish_video()
        index, state = self.task.init_state(seed)
        # Until this reset completes there is no episode: a failure below must not leave the
        # previous episode's seed and goal attached to a half-reset scene.
        self._episode, self._steps = None, 0
        # LIBERO draws fixture placement from NumPy's global RNG; seed it with the trial's seed
        # (the jitter is the seed's alone) and give the caller's generator back untouched.
        caller_rng = np.random.get_state()
        np.random.seed(jitter_seed(seed))
        try:
            with _quiet():
                self._control.reset()
        finally:
            np.random.set_state(caller_rng)
        # The gripper's command filter survives a soft reset; a fresh env starts it at zero.
        self.raw.robots[0].gripper.current_action[:] = 0.0
        self._robosuite_obs = self._control.set_init_state(state)
        perturbation = variation.perturbation(self.task, seed, self.scene) if variation else None
        goal = tuple(tuple(p) for p in self.raw.parsed_problem["goal_state"])
        prompt = self.task.prompt
        self.max_steps = self.options.max_steps or self.suite.max_steps
        if perturbation is not None:
            self._apply(perturbation)
            # The moved objects, seen if no settle step follows. Not by forcing robosuite's
            # update: that would shift its sampling substep for this episode.
            sampled = self.raw._observables[SAMPLED_SCENE]._sensor(None)
            self._robosuite_obs = {**self._robosuite_obs, SAMPLED_SCENE: sampled}
            goal = perturbation.goal or goal
            prompt = perturbation.prompt or prompt
            if self.options.max_steps is None and perturbation.max_steps:
                self.max_steps = perturbation.max_steps
        self._episode = EpisodeInfo(
            seed=seed,
            init_state=index,
            prompt=prompt,
            goal=goal,
            perturbation=perturbation,
            # The init state as set, perturbation applied, before settling: for an unperturbed
            # variation this is the init-state file's own vector (what vla-eval's adapter sets).
            init_state_digest=state_digest(self.raw.sim.get_state().flatten()),
        )
        for _ in range(self.options.settle_steps):
            self._robosuite_obs = self.raw.step(NOOP_ACTION)[0]
        self._steps = 0
        self._episode.scene_digest = scene_digest(self.raw.sim.data._data)
        self._start_recordings(video, video_wrist, frames, dataset)
        return self._observe_and_record()

    def _start_recordings(self, video, video_wrist: bool, frames, dataset) -> None:
        """The sinks of this episode's frames (reset's doc)."""
        model = self.raw.sim.model._model
        if video is not None:
            names = ("agentview", "wrist") if video_wrist else ("agentview",)
            writer = VideoWriter(video, fps=CONTROL_HZ)
            cameras = {c: resolve_camera(model, c) for c in names}
            self._recordings.append(_Recording(writer, cameras))
            self._episode.video = writer.path
        if frames is not None:
            cameras = {"agentview": resolve_camera(model, "agentview")}
            self._recordings.append(_Recording(StripWriter(frames.path), cameras, frames.every))
        if dataset is not None:
            self._dataset = DatasetRecorder(dataset)

    def _apply(self, perturbation: Perturbation) -> None:
        sim = self.raw.sim
        for name, (x, y) in perturbation.moves.items():
            joint = self.raw.objects_dict[name].joints[-1]
            qpos = sim.data.get_joint_qpos(joint).copy()
            qpos[:2] = (x, y)
            sim.data.set_joint_qpos(joint, qpos)
            sim.data.set_joint_qvel(joint, np.zeros(6))
        sim.forward()

    def step(self, action: Any) -> StepResult:
        self._check_open()
        episode = self.episode
        try:
            act = np.asarray(action, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):  # strings, ragged lists, None
            act = np.empty(0)
        if act.shape != (7,) or not np.all(np.isfinite(act)):
            shown = " ".join(repr(action).split())
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            raise SimInputError(
                f"action {shown} (shape {act.shape}): expected 7 finite numbers "
                "(dx dy dz, axis-angle 3, gripper -1 open / +1 close)"
            )
        if self._steps >= self.max_steps:
            raise EpisodeError(
                f"{self.task.suite} task {self.task.task_id} seed {episode.seed}: step limit "
                f"{self.max_steps} reached; reset() to start the next episode"
            )
        self._robosuite_obs = self.raw.step(act)[0]
        self._steps += 1
        obs = self._observe_and_record()
        success = self.success()
        return StepResult(
            obs=obs,
            success=success,
            completion=1.0 if success else self.completion(),
            steps=self._steps,
            truncated=not success and self._steps >= self.max_steps,
        )

    # -- scoring -----------------------------------------------------------------------------
    def goal_status(self) -> list[bool]:
        """Whether each conjunct of the episode's goal holds now."""
        return [bool(self.raw._eval_predicate(list(p))) for p in self.episode.goal]

    def success(self) -> bool:
        return all(self.goal_status())

    def completion(self) -> float:
        status = self.goal_status()
        return 1.0 if all(status) else sum(status) / len(status)

    # -- observations ------------------------------------------------------------------------
    def state(self) -> np.ndarray:
        grip = self.scene.gripper()
        return np.concatenate(
            [grip.eef_pos, quat_xyzw_to_axis_angle(grip.hand_quat_xyzw), grip.finger_qpos]
        ).astype(np.float32)

    def observe(self, cameras: tuple[str, ...] | None = None) -> Observation:
        """The observation; `cameras` renders those instead of the env's configured ones."""
        if cameras is None:
            chosen = self._cameras
        else:
            model = self.raw.sim.model._model
            chosen = {c: self._cameras.get(c) or resolve_camera(model, c) for c in cameras}
        return Observation(
            images={
                name: self.scene.renderer.rgb(mj, self.options.height, self.options.width)
                for name, mj in chosen.items()
            },
            state=self.state(),
            prompt=self.episode.prompt,
        )

    def libero_obs(
        self, size: int = LIBERO_CAMERA_SIZE, wrist: bool = True
    ) -> dict[str, np.ndarray]:
        """This state as LIBERO's OffScreenRenderEnv (camera_heights = camera_widths = `size`)
        hands it to an evaluation client: `agentview_image` and `robot0_eye_in_hand_image` as
        robosuite stores them (upside down, 4x MSAA), and robosuite's proprio observables
        `robot0_eef_pos`, `robot0_eef_quat` (xyzw) and `robot0_gripper_qpos`. `wrist=False`
        leaves the wrist image out, unrendered (a client that does not send it; rendering
        changes no state, so the episode is the same).

        The policy observation formats (policies/formats.py) apply their clients' recipes to
        this dict; tests/test_formats.py checks it against OffScreenRenderEnv itself."""
        _ = self.episode  # raises unless an episode is running
        import mujoco

        model = self.raw.sim.model._model
        if self._sampled_data is None:
            self._sampled_data = mujoco.MjData(model)
        data, at = self._sampled_data, 0
        sampled = self._robosuite_obs[SAMPLED_SCENE]
        for name in RENDERED_FRAMES:
            frame = getattr(data, name)
            frame.flat[:] = sampled[at : at + frame.size]
            at += frame.size
        out = {
            f"{key}_image": self.scene.renderer.rgb(
                resolve_camera(model, camera), size, size, multisample=True, data=data
            )[::-1]
            for key, camera in (("agentview", "agentview"), ("robot0_eye_in_hand", "wrist"))
            if wrist or key == "agentview"
        }
        for key in ("robot0_eef_pos", "robot0_eef_quat", "robot0_gripper_qpos"):
            out[key] = np.array(self._robosuite_obs[key], dtype=np.float64)
        return out

    def _observe_and_record(self) -> Observation:
        obs = self.observe()
        due = [r for r in self._recordings if self._steps % r.every == 0]
        rendered = dict(obs.images)  # each camera renders once per step, for every sink
        for recording in due:
            frame = []
            for name, mj in recording.cameras.items():
                if name not in rendered:
                    rendered[name] = self.scene.renderer.rgb(
                        mj, self.options.height, self.options.width
                    )
                frame.append(rendered[name])
            recording.sink.append(np.concatenate(frame, axis=1))
        dataset = self._dataset
        if dataset is not None and self._steps % dataset.every == 0:
            dataset.append(self.libero_obs(dataset.size))
        return obs

    def finish_video(self) -> int:
        """Finalise the episode's recordings (video, frame strip); return the video's frame
        count (0 without one). Every recording is closed; the first that fails is raised."""
        recordings, self._recordings = self._recordings, []
        frames, failure = 0, None
        dataset, self._dataset = self._dataset, None
        if dataset is not None:
            try:
                dataset.close()
            except VideoError as exc:
                failure = exc
        for recording in recordings:
            try:
                count = recording.sink.close()
            except VideoError as exc:
                failure = failure or exc
                continue
            if isinstance(recording.sink, VideoWriter):
                frames = count
        if self._episode is not None and self._episode.video is not None:
            self._episode.video_frames = frames
        if failure is not None:
            raise failure
        return frames

    # -- lifetime ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise EpisodeError(f"{self.task.suite} task {self.task.task_id}: env is closed")

    def close(self) -> None:
        if self._closed:
            return
        self.finish_video()
        self.scene.close()
        self._control.close()
        self._closed = True

    def __enter__(self) -> LiberoEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_env(
    suite: str, task_id: int, options: EnvOptions | None = None, egl_device: int | None = None
) -> LiberoEnv:
    return LiberoEnv(get_suite(suite).task(task_id), options, egl_device)
