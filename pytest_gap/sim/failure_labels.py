"""How a failed episode failed, read from its per-step evidence (sim/step_log.py).

One label per failed episode, the first rule that holds, in this order:

- `out_of_steps_holding`: the step budget ran out with an object in the hand;
- `grasped_and_dropped`: it held a goal object and lost it while the gripper was still
  commanded closed (it slipped or was knocked out);
- `placed_off_target`: it held a goal object and opened the gripper, and the goal still failed;
- `stopped_holding`: the episode ended before its budget (a policy's `done`, a workflow's end)
  with an object in the hand;
- `grasped_wrong_object`: it held objects, never one the goal names;
- `never_reached_target`: the hand never came within `REACH_M` of a goal object's box;
- `reached_not_grasped`: the hand got there but never held a goal object.

Episodes with no evidence to read (no step ran, or a backend without a scene: no `grasped` or
`target_dist` column values) are `no_evidence`. A successful episode has no label.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the report and the plugin read FAILURE_LABELS without starting numpy
    import numpy as np

REACH_M = 0.05  # the hand this close to a goal object's box has reached it
FAILURE_LABELS = (
    "out_of_steps_holding",
    "grasped_and_dropped",
    "placed_off_target",
    "stopped_holding",
    "grasped_wrong_object",
    "never_reached_target",
    "reached_not_grasped",
    "no_evidence",
)
CLOSED = 0.0  # an executed gripper command above this closes the fingers


def failure_label(
    steps: Mapping[str, np.ndarray], targets: tuple[str, ...], *, truncated: bool
) -> str:
    """The label of one failed episode (the module doc) from its step columns
    (`StepLog.columns()` or `read_steps`), the goal's objects, and whether it ran out of
    steps."""
    import numpy as np

    grasped = list(steps.get("grasped", ()))
    dist = np.asarray(steps.get("target_dist", ()), dtype=np.float64)
    if not grasped or (all(g is None for g in grasped) and not np.isfinite(dist).any()):
        return "no_evidence"
    gripper = np.asarray(steps["gripper"], dtype=np.float64)
    holding_at_end = grasped[-1] is not None
    if holding_at_end and truncated:
        return "out_of_steps_holding"
    goal = set(targets)
    for i in range(1, len(grasped)):
        before, now = grasped[i - 1], grasped[i]
        if before in goal and now != before:
            return "grasped_and_dropped" if gripper[i] > CLOSED else "placed_off_target"
    held_goal = any(g in goal for g in grasped)
    if holding_at_end:
        return "stopped_holding"
    if not held_goal and any(g is not None for g in grasped):
        return "grasped_wrong_object"
    if np.isfinite(dist).any() and np.nanmin(dist) > REACH_M:
        return "never_reached_target"
    return "reached_not_grasped"
