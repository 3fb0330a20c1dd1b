"""Observation and action formats: what run_policy sends a policy server, how it reads replies.

A registry entry's `obs_format:` names one of these. Each is converted here and only here, from
the env's LIBERO view of the scene (`LiberoEnv.libero_obs`: what LIBERO's OffScreenRenderEnv
returns at 256x256), and tests/test_formats.py checks it against the reference client's own code:

- `openpi-libero`: what openpi's LIBERO example client (examples/libero/main.py) sends, which is
  what openpi's `LiberoInputs` reads: `observation/image` and `observation/wrist_image`, the
  256x256 renders rotated 180 degrees (`raw[::-1, ::-1]`, as the training data was stored) and
  resized with padding to 224x224 (uint8 HWC); `observation/state`, 8 floats: eef position,
  robosuite's axis-angle of the eef quaternion, gripper qpos (2); `prompt`. A reply's `actions`
  is an (H, 7) chunk with H >= replan_every, applied as sent.
- `vla-eval-libero`: what vla-eval 0.8.0's `LIBEROBenchmark.make_obs` sends: `images`
  {agentview, wrist?} rotated 180 degrees at 256x256 (PNG on the wire), `task_description`,
  and with `send_state` `states` (float64) and `controller_states` (float32). What is sent
  follows the server's HELLO `observation_params`, as vla-eval's orchestrator does. A reply is one
  7-D action (vla-eval model servers buffer their chunks), the gripper snapped to -1 / +1.
- `gap`: the harness's native format for servers written for it: `images` {agentview, wrist}
  upright at the env's camera size, `state` 8-D, `prompt`; replies are (H, 7) chunks.

Actions are 7-D OSC_POSE deltas (xyz, axis-angle, gripper -1 open / +1 closed) in every format.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from PIL import Image

from pytest_gap.errors import GapError
from pytest_gap.policies.endpoint import ObsFormatName

if TYPE_CHECKING:
    from pytest_gap.policies.endpoint import PolicyEndpoint
    from pytest_gap.sim.libero import LiberoEnv

OPENPI_IMAGE_SIZE = 224  # openpi's LIBERO client: --resize-size 224
GAP_CAMERAS = ("agentview", "wrist")


class ReplyError(ValueError):
    """A reply a format cannot turn into actions (the policy's fault, not the transport's)."""


class UnsupportedServerRequest(GapError, RuntimeError):
    """A server asked for an observation option the harness does not provide."""


class ObsFormat(ABC):
    """One wire format for one family of policy servers (openpi's BasePolicy-sized ABC)."""

    name: ClassVar[ObsFormatName]

    @abstractmethod
    def observation(self, env: LiberoEnv, prompt: str, server: Mapping[str, Any]) -> dict:
        """The request for the env's current state; `server` is the server's handshake
        metadata (openpi's metadata frame, vla-eval's HELLO reply)."""

    @abstractmethod
    def actions(self, reply: Any, replan_every: int) -> np.ndarray:
        """The reply's actions as an (H, 7) float64 array, H >= 1; ReplyError if unusable."""


def resize_with_pad(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """`openpi_client.image_tools.resize_with_pad` for one HWC uint8 image: PIL bilinear resize
    keeping the aspect ratio, centred on a black canvas (tf.image.resize_with_pad's layout).

    Kept here because openpi-client is not a runtime dependency (it pins numpy<2); the test
    compares it with openpi-client's own function."""
    if image.shape[:2] == (height, width):
        return image
    pil = Image.fromarray(image)
    ratio = max(pil.width / width, pil.height / height)
    resized_h, resized_w = int(pil.height / ratio), int(pil.width / ratio)
    resized = pil.resize((resized_w, resized_h), resample=Image.BILINEAR)
    canvas = Image.new(resized.mode, (width, height), 0)
    canvas.paste(
        resized, (max(0, int((width - resized_w) / 2)), max(0, int((height - resized_h) / 2)))
    )
    return np.asarray(canvas)


def _chunk(reply: Any) -> np.ndarray:
    actions = reply.get("actions") if isinstance(reply, Mapping) else None
    try:
        array = np.asarray(actions, dtype=np.float64)
    except (TypeError, ValueError):
        array = np.empty(0)
    if array.ndim != 2 or array.shape[1] != 7 or not len(array):
        raise ReplyError(
            f"replied without an (H, 7) `actions` array (got {getattr(actions, 'shape', None)})"
        )
    return array


class GapFormat(ObsFormat):
    name = "gap"

    def observation(self, env: LiberoEnv, prompt: str, server: Mapping[str, Any]) -> dict:
        obs = env.observe(GAP_CAMERAS).as_dict()
        if prompt:
            obs["prompt"] = prompt
        return obs

    def actions(self, reply: Any, replan_every: int) -> np.ndarray:
        return _chunk(reply)


class OpenpiLiberoFormat(ObsFormat):
    name = "openpi-libero"

    def observation(self, env: LiberoEnv, prompt: str, server: Mapping[str, Any]) -> dict:
        from robosuite.utils.transform_utils import quat2axisangle

        raw = env.libero_obs()
        size = OPENPI_IMAGE_SIZE
        return {
            "observation/image": resize_with_pad(
                np.ascontiguousarray(raw["agentview_image"][::-1, ::-1]), size, size
            ),
            "observation/wrist_image": resize_with_pad(
                np.ascontiguousarray(raw["robot0_eye_in_hand_image"][::-1, ::-1]), size, size
            ),
            "observation/state": np.concatenate(
                (
                    raw["robot0_eef_pos"],
                    quat2axisangle(raw["robot0_eef_quat"].copy()),  # it clips in place
                    raw["robot0_gripper_qpos"],
                )
            ),
            "prompt": str(prompt or env.episode.prompt),
        }

    def actions(self, reply: Any, replan_every: int) -> np.ndarray:
        chunk = _chunk(reply)
        if len(chunk) < replan_every:  # openpi's client asserts the same
            raise ReplyError(
                f"replied with {len(chunk)} actions, fewer than replan_every={replan_every} "
                "(openpi's LIBERO client needs a chunk at least that long)"
            )
        return chunk


def _vla_quat_to_axisangle(quat: np.ndarray, antipodal: bool) -> np.ndarray:
    """vla_eval.rotation.quat_to_axisangle (antipodal: w >= 0 first) or, for servers that ask
    `quat_no_antipodal`, its robosuite-style variant; both float32, as vla-eval sends them.
    The two disagree in sign whenever w < 0, which LIBERO's top-down grasp pose is close to."""
    q = np.array(quat, dtype=np.float64)
    if antipodal:
        q = -q if q[3] < 0 else q
        w = float(np.clip(q[3], -1.0, 1.0))
        sin_half = np.sqrt(1.0 - w * w)
        if sin_half < 1e-8:
            return np.zeros(3, dtype=np.float32)
        return (q[:3] / sin_half * (2.0 * np.arccos(w))).astype(np.float32)
    q[3] = min(max(q[3], -1.0), 1.0)
    den = np.sqrt(1.0 - q[3] * q[3])
    if math.isclose(den, 0.0):
        return np.zeros(3, dtype=np.float32)
    return (q[:3] * 2.0 * math.acos(q[3]) / den).astype(np.float32)


def _matrix_to_quat(mat: np.ndarray) -> np.ndarray:
    """vla_eval.rotation.matrix_to_quat (Shepperd's method, xyzw), branch for branch: near
    w = 0 the branch decides the sign that the antipodal step then keeps."""
    m = np.asarray(mat, dtype=np.float64)
    tr = m[0, 0] + m[1, 1] + m[2, 2]
    if tr > 0:
        s = 2.0 * np.sqrt(tr + 1.0)
        w, x = 0.25 * s, (m[2, 1] - m[1, 2]) / s
        y, z = (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s
    elif m[0, 0] > m[1, 1] and m[0, 0] > m[2, 2]:
        s = 2.0 * np.sqrt(1.0 + m[0, 0] - m[1, 1] - m[2, 2])
        w, x = (m[2, 1] - m[1, 2]) / s, 0.25 * s
        y, z = (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s
    elif m[1, 1] > m[2, 2]:
        s = 2.0 * np.sqrt(1.0 + m[1, 1] - m[0, 0] - m[2, 2])
        w, x = (m[0, 2] - m[2, 0]) / s, (m[0, 1] + m[1, 0]) / s
        y, z = 0.25 * s, (m[1, 2] + m[2, 1]) / s
    else:
        s = 2.0 * np.sqrt(1.0 + m[2, 2] - m[0, 0] - m[1, 1])
        w, x = (m[1, 0] - m[0, 1]) / s, (m[0, 2] + m[2, 0]) / s
        y, z = (m[1, 2] + m[2, 1]) / s, 0.25 * s
    return np.array([x, y, z, w])


class VlaEvalLiberoFormat(ObsFormat):
    name = "vla-eval-libero"
    # LIBEROBenchmark constructor options a server may ask for in its HELLO reply that change
    # what is observed; the others (seed, env_seed, num_steps_wait, max_steps) do not, here.
    OBSERVATION_PARAMS = ("send_wrist_image", "send_state", "quat_no_antipodal")

    def observation(self, env: LiberoEnv, prompt: str, server: Mapping[str, Any]) -> dict:
        params = dict(server.get("observation_params") or {})
        if params.get("absolute_action"):
            raise UnsupportedServerRequest(
                "the vla-eval server asks for absolute_action: true; pytest-gap's "
                "vla-eval-libero format drives LIBERO with delta actions only"
            )
        # vla-eval's adapter renders the wrist camera at every step; it is only sent when
        # asked for, and rendering it changes nothing else, so it is rendered only then
        raw = env.libero_obs(wrist=bool(params.get("send_wrist_image")))
        images = {"agentview": np.ascontiguousarray(raw["agentview_image"][::-1, ::-1])}
        if params.get("send_wrist_image"):
            images["wrist"] = np.ascontiguousarray(raw["robot0_eye_in_hand_image"][::-1, ::-1])
        obs: dict[str, Any] = {"images": images, "task_description": prompt or env.episode.prompt}
        if params.get("send_state"):
            antipodal = not params.get("quat_no_antipodal", False)
            obs["states"] = np.concatenate(
                [
                    raw["robot0_eef_pos"],
                    _vla_quat_to_axisangle(raw["robot0_eef_quat"], antipodal),
                    raw["robot0_gripper_qpos"],
                ]
            )
            # vla-eval reads the arm controller's own pose estimate too (X-VLA uses it).
            controller = env.raw.robots[0].controller
            ee_ori = np.asarray(controller.ee_ori_mat, dtype=np.float32)
            obs["controller_states"] = np.concatenate(
                [
                    np.asarray(controller.ee_pos, dtype=np.float32),
                    _vla_quat_to_axisangle(_matrix_to_quat(ee_ori), antipodal=True),
                    np.asarray(raw["robot0_gripper_qpos"], dtype=np.float32),
                ]
            )
        return obs

    def actions(self, reply: Any, replan_every: int) -> np.ndarray:
        raw = reply.get("actions", reply.get("action")) if isinstance(reply, Mapping) else None
        try:
            action = np.asarray(raw, dtype=np.float64)
        except (TypeError, ValueError):
            action = np.empty(0)
        if action.shape == (1, 7):  # what a client that keeps replies 2-D makes of one action
            action = action[0]
        if action.shape != (7,):
            raise ReplyError(
                f"replied with actions of shape {getattr(action, 'shape', None)}; vla-eval's "
                "LIBERO benchmark applies one 7-D action per observation (give the model "
                "server a chunk_size so that it buffers its chunks)"
            )
        action[6] = -1.0 if action[6] < 0 else 1.0  # vla-eval snaps the gripper
        return action[None, :]


def vla_eval_task(env: LiberoEnv) -> dict[str, Any]:
    """The `task` of the EPISODE_START vla-eval's loop sends for the env's running episode:
    `LIBEROBenchmark.get_tasks()`'s entry (`name` the task's language, `suite`, `task_id`) with
    the orchestrator's `episode_idx` (the init state), less what does not serialise (its
    SyncEpisodeRunner keeps str, int, float, bool and list values: the LIBERO task object goes,
    and so does whatever an env cannot say)."""
    spec = getattr(env, "task", None)  # the libero backend's TaskSpec; other envs name their own
    episode = env.episode
    suite = getattr(spec, "suite", None) or getattr(env, "suite", None)
    task_id = getattr(spec, "task_id", None)
    task = {
        "name": episode.prompt,
        "suite": suite,
        "task_id": getattr(env, "task_id", None) if task_id is None else task_id,
        "episode_idx": episode.init_state,
    }
    return {k: v for k, v in task.items() if isinstance(v, str | int | float | bool | list)}


FORMATS: dict[str, ObsFormat] = {
    f.name: f for f in (OpenpiLiberoFormat(), VlaEvalLiberoFormat(), GapFormat())
}


def obs_format(endpoint: PolicyEndpoint) -> ObsFormat:
    """The format a policy endpoint's server speaks."""
    return FORMATS[endpoint.obs_format]
