"""The config a service run takes: one remote policy on loopback, `policy_only`, one trial.

Tests of the service doors and the bench that measures them submit this config with one key
or another changed; a key given as None is left out so the config falls back to its default.
"""

from __future__ import annotations

import copy

REMOTE_POLICY = {"remote": {"url": "ws://127.0.0.1:1", "obs_format": "gap"}}


def remote_policy_config(max_steps: int = 20, **benchmark) -> dict:
    block = {
        "families": ["libero"],
        "variations": ["object"],
        "modes": ["policy_only"],
        "policies": ["remote"],
        "task_ids": [0],
        "n_seeds": 1,
        "gate_threshold": 0.0,
        "mode_overrides": {"policy_only": {"template": "policy_only"}},
        **benchmark,
    }
    return {
        "policies": copy.deepcopy(REMOTE_POLICY),
        "trials": {"max_steps": max_steps},
        "benchmark": {k: v for k, v in block.items() if v is not None},
    }
