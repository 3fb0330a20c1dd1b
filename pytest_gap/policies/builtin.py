"""Built-in policies for baselines and plumbing checks, and loading a user's policy class.

Actions follow the harness convention: (H, 7) chunks of OSC_POSE deltas (xyz, axis-angle,
gripper; gripper -1 open, +1 closed).
"""

from __future__ import annotations

import importlib

import numpy as np

from pytest_gap.errors import GapError

DEFAULT_HORIZON = 10


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


BUILTINS = {"hold": HoldPolicy, "random": RandomPolicy, "scripted": ScriptedPolicy}


def load_policy(name: str):
    """A built-in name, or `module:Class` whose instances have infer(obs) -> dict."""
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
