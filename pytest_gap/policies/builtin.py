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


BUILTINS = {"hold": HoldPolicy, "random": RandomPolicy}


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
