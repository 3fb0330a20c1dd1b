"""Per-step evidence of one episode: what each control step did, kept in columns.

One row per counted control step, in the order they ran:

- `step`: the episode's step count after this step (1, 2, ...);
- `reply`: which policy reply (0-based, in the episode) the action came from; null for a step
  no policy chose (a scripted skill, a bring-up). Consecutive rows with one reply are a chunk;
- `action`: the 7-D action given to the simulator (after vla-eval's LIBERO adapter snapped its
  gripper entry to -1/+1, on that backend); `gripper`: the gripper command the robot executed
  (robosuite's Panda ramps its fingers' command toward the action's sign, 0.2 a step:
  `SceneView.gripper_command`), -1 open to +1 closed;
- `state`: the 8-D proprio state (eef xyz, axis-angle, two finger joints) *before* the step,
  which at a reply's first step is the state its observation carried;
- `reward`, `done`: the simulator's (1.0 and done at the successful step);
- `grasped`: the movable object held after the step (SceneView.grasped), null for none;
- `target_dist`: metres from the hand to the nearest of the goal's objects after the step
  (`SceneView.hand_distance`: to the nearest box of their collision geoms).

`grasped` and `target_dist` need the scene (null where a backend offers none). Rows are kept as
Python lists until `write`: appending one costs a few microseconds beside a control step's
10-20 ms (bench/step_evidence.py measures it). The file is Parquet (`STEPS_FILE`), one per
trial beside result.json; `read_steps` gives its columns back as NumPy arrays.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pytest_gap.layout import STEPS_FILE

__all__ = ["STEPS_FILE", "StepLog", "goal_objects", "read_steps"]
ACTION_DIM, STATE_DIM = 7, 8
COLUMNS = (
    "step",
    "reply",
    "action",
    "gripper",
    "state",
    "reward",
    "done",
    "grasped",
    "target_dist",
)


def goal_objects(goal: Iterable[Sequence[str]]) -> tuple[str, ...]:
    """The objects a goal asks to move or operate: each conjunct's first argument
    (`('in', 'milk_1', 'basket_1_contain_region')` -> milk_1, `('open', 'drawer_1')` ->
    drawer_1), in goal order, once each."""
    found: dict[str, None] = {}
    for predicate in goal:
        if len(predicate) >= 2:
            found.setdefault(str(predicate[1]), None)
    return tuple(found)


class StepLog:
    """The evidence of one episode's control steps (the module doc), appended step by step."""

    def __init__(self, scene=None, targets: Sequence[str] = ()):
        self.scene = scene  # a SceneView for `grasped` and `target_dist`, or None
        known = {o.name for o in scene.objects()} if scene is not None else set()
        self.targets = tuple(t for t in targets if t in known)
        self.rows: dict[str, list] = {name: [] for name in COLUMNS}
        self._state: np.ndarray | None = None  # the state after the last step

    @classmethod
    def of(cls, env) -> StepLog:
        """A log for the episode `env` was just reset to: its scene, its goal's objects."""
        return cls(env.scene, goal_objects(env.episode.goal))

    def __len__(self) -> int:
        return len(self.rows["step"])

    def start(self, state: Any) -> None:
        """The proprio state the episode's first step starts from."""
        self._state = np.asarray(state, dtype=np.float32).reshape(-1)

    def record(
        self,
        *,
        step: int,
        action: Any,
        state_after: Any,
        reward: float,
        done: bool,
        reply: int | None = None,
        gripper: float | None = None,
    ) -> None:
        """One control step that ran; `state_after` is the proprio state it left. `gripper`
        (the command executed) defaults to the scene's (`SceneView.gripper_command`), else to
        the action's gripper entry clipped to [-1, 1]."""
        after = np.asarray(state_after, dtype=np.float32).reshape(-1)
        before = self._state if self._state is not None else np.full(STATE_DIM, np.nan)
        act = np.asarray(action, dtype=np.float32).reshape(-1)[:ACTION_DIM]
        if gripper is None:
            gripper = (
                self.scene.gripper_command()
                if self.scene is not None
                else float(np.clip(act[-1], -1.0, 1.0))
            )
        rows = self.rows
        rows["step"].append(int(step))
        rows["reply"].append(reply)
        rows["action"].append(act)
        rows["gripper"].append(float(gripper))
        rows["state"].append(before)
        rows["reward"].append(float(reward))
        rows["done"].append(bool(done))
        grasped, dist = self._scene_facts()
        rows["grasped"].append(grasped)
        rows["target_dist"].append(dist)
        self._state = after

    def _scene_facts(self) -> tuple[str | None, float | None]:
        if self.scene is None:
            return None, None
        grasped = self.scene.grasped()
        if not self.targets:
            return grasped, None
        return grasped, self.scene.hand_distance(self.targets)

    def table(self):
        """The rows as a pyarrow Table (fixed-size lists for `action` and `state`)."""
        import pyarrow as pa

        rows, n = self.rows, len(self)

        def vectors(name: str, dim: int):
            flat = np.zeros((n, dim), np.float32)
            for i, v in enumerate(rows[name]):
                flat[i, : min(dim, v.size)] = v[:dim]
            return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), dim)

        return pa.table(
            {
                "step": pa.array(rows["step"], pa.int32()),
                "reply": pa.array(rows["reply"], pa.int32()),
                "action": vectors("action", ACTION_DIM),
                "gripper": pa.array(rows["gripper"], pa.float32()),
                "state": vectors("state", STATE_DIM),
                "reward": pa.array(rows["reward"], pa.float32()),
                "done": pa.array(rows["done"], pa.bool_()),
                "grasped": pa.array(rows["grasped"], pa.string()).dictionary_encode(),
                "target_dist": pa.array(rows["target_dist"], pa.float32()),
            }
        )

    def write(self, path: Path) -> Path:
        """The rows to `path` (Parquet), whole or not at all (temporary file, then rename)."""
        import pyarrow.parquet as pq

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        pq.write_table(self.table(), tmp, compression="zstd")
        os.replace(tmp, path)
        return path

    def columns(self) -> dict[str, np.ndarray]:
        """The rows as NumPy columns, as `read_steps` gives them back from the file."""
        return _columns(self.table())


def _columns(table) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    n = table.num_rows
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        if name in ("action", "state"):
            dim = ACTION_DIM if name == "action" else STATE_DIM
            out[name] = column.flatten().to_numpy(zero_copy_only=False).reshape(n, dim)
        elif name == "grasped":
            out[name] = np.array(column.cast("string").to_pylist(), dtype=object)
        elif name == "reply":
            out[name] = np.array([-1 if r is None else r for r in column.to_pylist()], np.int64)
        elif name == "target_dist":
            out[name] = np.array(
                [np.nan if d is None else d for d in column.to_pylist()], np.float64
            )
        else:
            out[name] = column.to_numpy(zero_copy_only=False)
    return out


def read_steps(path: Path) -> dict[str, np.ndarray]:
    """A steps file's columns (the module doc): `reply` -1 and `target_dist` NaN where null,
    `grasped` an object array with None where nothing is held."""
    import pyarrow.parquet as pq

    return _columns(pq.read_table(path))
