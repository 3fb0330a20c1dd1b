"""What skills see with (`skills.perception` in a benchmark YAML), as plain data: the config
model, the plan's cells and `gap run --perception` read it without importing the simulator.

"privileged" adds an overhead camera (birdview) a policy never gets, and lets graphs ask the
simulator's goal check; "policy_cameras" sees only through the two cameras a policy gets (front
and wrist) and has no goal check: a graph ends on what its skills saw.
"""

from __future__ import annotations

from typing import Literal

Perception = Literal["privileged", "policy_cameras"]
PERCEPTION_CAMERAS: dict[str, tuple[str, ...]] = {
    "privileged": ("agentview", "birdview"),
    "policy_cameras": ("agentview", "wrist"),
}
