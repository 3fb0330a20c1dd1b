"""The policy_only configs tests run: one remote policy on loopback (what a service run takes),
or one the session serves itself (`gap policy serve hold`), libero_object task 0.

Tests of the service doors and the bench that measures them submit the first with one key or
another changed; a key given as None is left out so the config falls back to its default.
"""

from __future__ import annotations

import copy

REMOTE_POLICY = {"remote": {"url": "ws://127.0.0.1:1", "obs_format": "gap"}}


def remote_policy_config(max_steps: int = 20, **benchmark) -> dict:
    return policy_only_config(copy.deepcopy(REMOTE_POLICY), max_steps, **benchmark)


def served_hold_config(gap: str, max_steps: int, **benchmark) -> dict:
    """`gap policy serve hold` (zero motion, chunks of 10) started by the session itself."""
    serve = {"hold": {"command": [gap, "policy", "serve", "hold", "--port", "{port}"]}}
    return policy_only_config(serve, max_steps, **{"output_dir": "runs", **benchmark})


def policy_only_config(policies: dict, max_steps: int, **benchmark) -> dict:
    """`policies` (the registry, its ids the policy axis) on libero_object task 0."""
    block = {
        "families": ["libero"],
        "variations": ["object"],
        "modes": ["policy_only"],
        "policies": list(policies),
        "task_ids": [0],
        "n_seeds": 1,
        "gate_threshold": 0.0,
        "mode_overrides": {"policy_only": {"template": "policy_only"}},
        **benchmark,
    }
    return {
        "policies": policies,
        "trials": {"max_steps": max_steps},
        "benchmark": {k: v for k, v in block.items() if v is not None},
    }
