"""A stand-in for a policy that learned its training scenes' layout rather than to look: the
scripted oracle (builtin.ScriptedPolicy), but it carries to where the basket stands in
libero_object's own init states (within 2 cm of (0.0, 0.26) in every task and seed), wherever
the basket is. What posvar's matched control arm is for: unperturbed it succeeds, with the
basket moved it drops the object where the basket used to be. Served by tests with
`gap policy serve tests.memorized_basket:MemorizedBasket`."""

from __future__ import annotations

import numpy as np

from pytest_gap.policies.builtin import ScriptedPolicy

TRAINED_BASKET_XY = np.array([0.003, 0.26])


class MemorizedBasket(ScriptedPolicy):
    def infer(self, obs: dict) -> dict:
        state = obs.get("privileged")
        if isinstance(state, dict) and state.get("container") in state.get("objects", {}):
            box = state["objects"][state["container"]]
            lo, hi = np.asarray(box["min"], float), np.asarray(box["max"], float)
            shift = TRAINED_BASKET_XY - (lo[:2] + hi[:2]) / 2
            moved = {"min": [*(lo[:2] + shift), lo[2]], "max": [*(hi[:2] + shift), hi[2]]}
            objects = {**state["objects"], state["container"]: moved}
            obs = {**obs, "privileged": {**state, "objects": objects}}
        return super().infer(obs)
