"""Built-in policies for baselines and plumbing checks, and loading a user's policy class.

Actions follow the harness convention: (H, 7) chunks of OSC_POSE deltas (xyz, axis-angle,
gripper; gripper -1 open, +1 closed).

A policy that keeps state across the calls of an episode (replay) has `fork() -> policy`: a
fresh copy at the episode's start. The servers call it once per episode (policies/server.py:
per connection; policies/vla_eval_server.py: per EPISODE_START), so concurrent episodes never
share that state. A policy without fork() is one object for every connection.
"""

from __future__ import annotations

import copy
import importlib
import io
import json
from pathlib import Path

import numpy as np

from pytest_gap.errors import GapError, one_line

DEFAULT_HORIZON = 10
# openpi's LIBERO client and run_policy execute the first 5 actions of each reply
# (replan_every): a replay chunk of 5 is then executed whole, and the next reply goes on from it.
DEFAULT_REPLAY_CHUNK = 5
ACTIONS_FIX = 'give a .npy float array (N, 7) or a .json {"actions": [[7 numbers], ...]}'


class HoldPolicy:
    """Zero motion with the gripper open: what 'doing nothing' scores."""

    def __init__(self, horizon: int = DEFAULT_HORIZON):
        self.horizon = horizon

    def infer(self, obs: dict) -> dict:
        actions = np.zeros((self.horizon, 7), dtype=np.float32)
        actions[:, 6] = -1.0
        return {"actions": actions}


class RandomPolicy:
    """Uniform random deltas and gripper commands, seeded: the chance-level baseline."""

    def __init__(self, horizon: int = DEFAULT_HORIZON, seed: int = 0, scale: float = 0.5):
        self.horizon, self.scale = horizon, scale
        self._rng = np.random.default_rng(seed)

    def infer(self, obs: dict) -> dict:
        actions = self._rng.uniform(-self.scale, self.scale, size=(self.horizon, 7))
        actions[:, 6] = self._rng.choice([-1.0, 1.0], size=self.horizon)
        return {"actions": actions.astype(np.float32)}


class ScriptedPolicy:
    """An oracle baseline: a pick-and-place script over privileged ground truth.

    It reads `obs["privileged"]` (object boxes, targets, container, grip site), which the
    harness sends only to registry entries with `privileged_state: true`; such results are
    labelled privileged in every summary. It has no memory: each chunk is chosen from the
    current state (move above the next target at a safe height, descend, close, lift, carry
    over the container, lower, open).
    """

    horizon = 5
    # Its observations carry simulator ground truth that only pytest-gap's own run_policy sends
    # (openpi protocol, privileged_state: true); a server for other clients refuses it.
    needs_privileged_state = True
    step_m = 0.05  # OSC_POSE: an action of 1.0 moves the position target by 5 cm
    gain = 0.4
    hold_width = 0.07  # fingers closed further than this, near the object: holding it

    def infer(self, obs: dict) -> dict:
        state = obs.get("privileged")
        if not isinstance(state, dict):
            raise ValueError(
                "the scripted policy needs privileged_state: true in its registry entry"
            )
        pending = [t for t, d in zip(state["targets"], state["delivered"], strict=True) if not d]
        eef = np.asarray(state["eef"], float)
        if not pending or state["container"] is None:
            return self._chunk(eef, eef, -1.0) | {"done": True}
        lo, hi = self._box(state, pending[0])
        c_lo, c_hi = self._box(state, state["container"])
        center, height = (lo + hi) / 2, hi[2] - lo[2]
        closed = state["gripper_width"] < self.hold_width
        if closed and np.linalg.norm(eef - center) < 0.06:  # holding: carry and release
            over = np.array([*(c_lo[:2] + c_hi[:2]) / 2, c_hi[2] + height / 2 + 0.03])
            return self._toward(eef, over, c_hi[2] + height + 0.08, close=True)
        safe_z = max(hi[2], c_hi[2]) + 0.12
        if closed:  # closed on nothing: open before anything else
            return self._chunk(eef, eef, -1.0)
        grasp = np.array([center[0], center[1], max(hi[2] - 0.03, lo[2] + 0.01)])
        return self._toward(eef, grasp, safe_z, close=False)

    @staticmethod
    def _box(state: dict, name: str) -> tuple[np.ndarray, np.ndarray]:
        box = state["objects"][name]
        return np.asarray(box["min"], float), np.asarray(box["max"], float)

    def _toward(self, eef: np.ndarray, goal: np.ndarray, safe_z: float, close: bool) -> dict:
        held = 1.0 if close else -1.0
        if np.linalg.norm(eef[:2] - goal[:2]) > 0.012:  # travel at a safe height first
            if eef[2] < safe_z - 0.03:
                return self._chunk(eef, np.array([*eef[:2], safe_z]), held)
            return self._chunk(eef, np.array([*goal[:2], safe_z]), held)
        if eef[2] > goal[2] + 0.01:
            return self._chunk(eef, goal, held)
        return self._chunk(eef, eef, -held)  # arrived: release what is held, or grasp

    def _chunk(self, eef: np.ndarray, goal: np.ndarray, gripper: float) -> dict:
        # Command a fraction of the remaining distance each step: fast when far, no overshoot
        # when near (the arm lags its OSC target, so a whole-distance command would overshoot).
        delta = np.clip((goal - eef) * self.gain / self.step_m, -1.0, 1.0)
        actions = np.zeros((self.horizon, 7), np.float32)
        actions[:, :3] = delta
        actions[:, 6] = gripper
        return {"actions": actions}


class ReplayPolicy:
    """Replays recorded actions open-loop, whatever it observes: does a trajectory recorded
    elsewhere (a demonstration, another run) still do the task from this scene?

    Each reply is exactly `chunk` actions, the next ones of the recording; every episode starts
    from its first action (`fork()`). After the last recorded action it holds still: zero
    motion with the last action's gripper command, so what the gripper holds stays held.

    A client that executes the first k actions of each reply replays exactly when k == chunk
    (openpi's LIBERO client and run_policy: replan_every, default 5); served over vla-eval,
    whose benchmarks apply one action per observation, the server hands the chunk out one
    action at a time, so the replay advances by one action per observation.
    """

    def __init__(self, actions: np.ndarray, chunk: int = DEFAULT_REPLAY_CHUNK):
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise GapError(f"replay chunk {chunk!r}: give a whole number of actions, 1 or more")
        self.actions = _checked_actions(actions, "replay actions")
        self.horizon = chunk
        self._hold = np.zeros(7, self.actions.dtype)
        self._hold[6] = self.actions[-1, 6]
        self._hold.flags.writeable = False
        self._next = 0

    @classmethod
    def from_file(cls, path: str | Path, chunk: int = DEFAULT_REPLAY_CHUNK) -> ReplayPolicy:
        return cls(load_actions(path), chunk)

    def fork(self) -> ReplayPolicy:
        """A copy at the recording's first action; the (read-only) actions are shared, so a
        connection costs no copy of the recording."""
        forked = copy.copy(self)
        forked._next = 0
        return forked

    def infer(self, obs: dict) -> dict:
        start, self._next = self._next, self._next + self.horizon
        chunk = self.actions[start : start + self.horizon]
        held = np.tile(self._hold, (self.horizon - len(chunk), 1))
        return {"actions": np.concatenate([chunk, held])}


def load_actions(path: str | Path) -> np.ndarray:
    """The (N, 7) actions of a `.npy` array (no pickles) or a `.json` {"actions": [...]}, as
    a read-only float64 array; every way the file can be wrong is one GapError naming it."""
    path = Path(path)
    where = f"--actions {path}"
    if path.suffix not in (".npy", ".json"):
        raise GapError(f"{where}: not a .npy or .json file; {ACTIONS_FIX}")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise GapError(f"{where}: no such file; {ACTIONS_FIX}") from None
    except OSError as exc:
        raise GapError(f"{where}: cannot read it ({exc.strerror}); {ACTIONS_FIX}") from None
    array = _npy_actions(data, where) if path.suffix == ".npy" else _json_actions(data, where)
    return _checked_actions(array, where)


def _npy_actions(data: bytes, where: str) -> np.ndarray:
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as exc:  # numpy raises ValueError, OSError or EOFError for bad bytes
        raise GapError(
            f"{where}: not a numpy .npy array ({one_line(exc, 80)}); {ACTIONS_FIX}"
        ) from None
    if not isinstance(array, np.ndarray):  # an .npz archive renamed .npy
        raise GapError(f"{where}: an .npz archive, not one .npy array; {ACTIONS_FIX}")
    if array.dtype.kind not in "biuf":
        raise GapError(f"{where}: its dtype is {array.dtype}, not numbers; {ACTIONS_FIX}")
    return array


def _json_actions(data: bytes, where: str) -> np.ndarray:
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GapError(f"{where}: not JSON ({one_line(exc, 80)}); {ACTIONS_FIX}") from None
    rows = document.get("actions") if isinstance(document, dict) else None
    numbers = isinstance(rows, list) and all(
        isinstance(row, list)
        and all(isinstance(x, int | float) and not isinstance(x, bool) for x in row)
        for row in rows
    )
    if not numbers:
        raise GapError(f'{where}: no "actions" list of number rows in it; {ACTIONS_FIX}')
    try:
        return np.array(rows, dtype=np.float64)
    except ValueError:  # rows of different lengths
        raise GapError(f"{where}: its action rows differ in length; {ACTIONS_FIX}") from None


def _checked_actions(actions: np.ndarray, where: str) -> np.ndarray:
    array = np.array(actions, dtype=np.float64)  # a copy: the caller's array may change
    if array.ndim != 2 or array.shape[1] != 7 or array.shape[0] == 0:
        raise GapError(f"{where}: actions of shape {list(array.shape)}, not (N, 7); {ACTIONS_FIX}")
    bad = np.flatnonzero(~np.isfinite(array).all(axis=1))
    if bad.size:
        raise GapError(
            f"{where}: action {bad[0]} is not finite ({array[bad[0]].tolist()}); every value "
            "must be a finite number"
        )
    array.flags.writeable = False
    return array


BUILTINS = {
    "hold": HoldPolicy,
    "random": RandomPolicy,
    "scripted": ScriptedPolicy,
    "replay": ReplayPolicy,
}


def load_policy(name: str, *, actions: str | Path | None = None, chunk: int | None = None):
    """A built-in name, or `module:Class` whose instances have infer(obs) -> dict.

    `actions` (the file) and `chunk` are the replay policy's and refused for any other: a
    flag that silently did nothing would leave the user believing it had."""
    if name == "replay":
        if actions is None:
            raise GapError(f"policy 'replay' needs --actions FILE; {ACTIONS_FIX}")
        return ReplayPolicy.from_file(actions, DEFAULT_REPLAY_CHUNK if chunk is None else chunk)
    for flag, value in (("--actions", actions), ("--chunk", chunk)):
        if value is not None:
            raise GapError(f"{flag} is for the replay policy only, not {name!r}: drop it")
    if name in BUILTINS:
        return BUILTINS[name]()
    module_name, sep, attr = name.partition(":")
    if not sep or not module_name or not attr:
        raise GapError(f"policy {name!r}: use a built-in ({', '.join(BUILTINS)}) or module:Class")
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise GapError(f"policy {name!r}: cannot import it ({exc})") from None
    policy = target() if isinstance(target, type) else target
    if not callable(getattr(policy, "infer", None)):
        raise GapError(f"policy {name!r}: it has no infer(obs) -> dict method")
    return policy
