"""A DAgger round's policy: the learned checkpoint acts, the privileged oracle labels.

Served as `gap policy serve examples.policies.dagger:DaggerPolicy` by a registry entry with
`privileged_state: true` (examples/policies/dagger_round.yaml), with two variables:

    GAP_DAGGER_CHECKPOINT   the learned checkpoint that acts (save_checkpoint's file)
    GAP_DAGGER_LABELS       the directory its labels go to, one .npz per query

Each query is answered with the learned policy's chunk (so the episode visits the states the
learned policy visits) and labelled with the chunk the oracle (pytest_gap's ScriptedPolicy,
memoryless: it needs no history to label a state) would have sent: both cameras at the
checkpoint's image size, the state, the prompt and the oracle's actions. train.py's `--labels
DIR` adds them to the demonstrations.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from examples.policies.visuomotor import CAMERAS
from pytest_gap.policies.builtin import ScriptedPolicy
from pytest_gap.policies.torch_policy import load_checkpoint


class DaggerPolicy:
    needs_privileged_state = True  # the oracle reads the simulator's ground truth

    def __init__(self):
        self.learned = load_checkpoint(os.environ["GAP_DAGGER_CHECKPOINT"])
        self.labels = Path(os.environ["GAP_DAGGER_LABELS"])
        self.labels.mkdir(parents=True, exist_ok=True)
        self.oracle = ScriptedPolicy()
        self.size = self.learned.module.image_size

    def _small(self, image) -> np.ndarray:
        tensor = torch.from_numpy(np.asarray(image, np.uint8)).permute(2, 0, 1)[None].float()
        small = F.interpolate(tensor, size=(self.size, self.size), mode="area")
        return small[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).numpy()

    def infer(self, obs: dict) -> dict:
        label = np.asarray(self.oracle.infer(obs)["actions"], np.float32)
        seen = {k: v for k, v in obs.items() if k != "privileged"}
        acted = self.learned.infer(seen)
        np.savez(
            self.labels / f"{uuid.uuid4().hex}.npz",
            **{camera: self._small(obs["images"][camera]) for camera in CAMERAS},
            state=np.asarray(obs["state"], np.float32),
            prompt=str(obs.get("prompt", "")),
            actions=label,
        )
        return {"actions": acted["actions"]}
