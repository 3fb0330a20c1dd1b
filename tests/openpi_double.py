"""A stand-in for an openpi pi0/pi0.5 LIBERO server (no GPU or checkpoint here): it enforces the
input contract of openpi's `LiberoInputs` (src/openpi/policies/libero_policy.py) as openpi's
LIBERO client meets it, and answers like pi05_libero, a (10, 7) chunk.

Served with `gap policy serve openpi_double:LiberoInputsContract`; a broken request raises, which
the server reports as openpi's do (a text frame with the traceback, then close 1011).
"""

from __future__ import annotations

import numpy as np

IMAGE_KEYS = ("observation/image", "observation/wrist_image")
KEYS = {*IMAGE_KEYS, "observation/state", "prompt"}
ACTION_HORIZON = 10  # pi05_libero's


class LiberoInputsContract:
    """Zero motion with the gripper open, once the request is exactly what LiberoInputs reads."""

    def infer(self, obs: dict) -> dict:
        if set(obs) != KEYS:
            raise KeyError(f"LiberoInputs reads exactly {sorted(KEYS)}; got {sorted(obs)}")
        for key in IMAGE_KEYS:
            image = obs[key]
            if not (isinstance(image, np.ndarray) and image.dtype == np.uint8):
                raise TypeError(f"{key}: expected a uint8 array, got {type(image).__name__}")
            if image.shape != (224, 224, 3):
                raise ValueError(f"{key}: expected (224, 224, 3) HWC, got {image.shape}")
        state = obs["observation/state"]
        if not (isinstance(state, np.ndarray) and np.issubdtype(state.dtype, np.floating)):
            raise TypeError(f"observation/state: expected a float array, got {state!r}")
        if state.shape != (8,) or not np.all(np.isfinite(state)):
            raise ValueError(f"observation/state: expected 8 finite floats, got {state!r}")
        if not (isinstance(obs["prompt"], str) and obs["prompt"]):
            raise TypeError(f"prompt: expected the task instruction, got {obs['prompt']!r}")
        actions = np.zeros((ACTION_HORIZON, 7))
        actions[:, 6] = -1.0
        return {"actions": actions}
