"""Test helpers: reading and (as a test's hand) placing objects in a live scene."""

from __future__ import annotations

import numpy as np

from pytest_gap.sim.libero import LiberoEnv

# The generated variations that move objects (grocery_packing/object only relabels the goal).
MOVING_VARIATIONS = [
    ("posvar", "pos_var"),
    ("posvar", "permutation"),
    ("posvar", "basket_swap"),
    ("posvar", "all"),
    ("grocery_packing", "permutation"),
]


def poses(env: LiberoEnv) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Settled (position, wxyz quaternion) of every movable object."""
    return {
        o.name: (env.scene.pose(o.name).pos.copy(), env.scene.pose(o.name).quat.copy())
        for o in env.scene.objects()
    }


def positions(env: LiberoEnv) -> dict[str, np.ndarray]:
    """Settled xy of every movable object."""
    return {o.name: env.scene.pose(o.name).pos[:2].copy() for o in env.scene.objects()}


def drop_into(env: LiberoEnv, name: str, container: str, dx: float = 0.0, steps: int = 25):
    """Place an object above the container's region and let it fall in (a test's hand)."""
    region = env.scene.region(f"{container}_contain_region")
    joint = env.raw.objects_dict[name].joints[-1]
    qpos = env.raw.sim.data.get_joint_qpos(joint).copy()
    qpos[:3] = (region.pos[0] + dx, region.pos[1], region.pos[2] + 0.05)
    qpos[3:] = (1.0, 0.0, 0.0, 0.0)
    env.raw.sim.data.set_joint_qpos(joint, qpos)
    env.raw.sim.data.set_joint_qvel(joint, np.zeros(6))
    env.raw.sim.forward()
    result = None
    for _ in range(steps):
        result = env.step([0, 0, 0, 0, 0, 0, -1])
    return result
