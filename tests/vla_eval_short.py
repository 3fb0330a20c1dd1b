"""The two backends with a short step limit, for sessions that compare them in seconds rather
than minutes (a 280-step vla-eval LIBERO episode renders 2 cameras per step: about a minute).

Only the step limit differs from the built-ins, through the same paths a protocol limit takes
(the backend's `max_steps`, the env's `EnvOptions.max_steps`). Sessions name them by import
string with tests/ on PYTHONPATH: `backend: vla_eval_short:ShortVlaEval`.
"""

from __future__ import annotations

from pytest_gap.sim.backend import EnvOptions
from pytest_gap.sim.libero_backend import LiberoBackend
from pytest_gap.sim.vla_eval.backend import VlaEvalBackend

SHORT_STEPS = 12


class ShortVlaEval(VlaEvalBackend):
    def max_steps(self, suite: str) -> int:
        super().max_steps(suite)  # validates the suite
        return SHORT_STEPS


class ShortLibero(LiberoBackend):
    def max_steps(self, suite: str) -> int:
        super().max_steps(suite)
        return SHORT_STEPS

    def make_env(self, suite, task_id, options=None, egl_device=None):
        options = (options or EnvOptions()).model_copy(update={"max_steps": SHORT_STEPS})
        return super().make_env(suite, task_id, options, egl_device)
