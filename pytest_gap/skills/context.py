"""What a skill may touch: the env's action interface, its cameras, and its scene queries."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_gap.sim.backend import Env, StepResult
from pytest_gap.sim.render import CameraFrame
from pytest_gap.sim.step_log import StepLog
from pytest_gap.skills.perception_setting import PERCEPTION_CAMERAS, Perception

if TYPE_CHECKING:
    from pytest_gap.policies.endpoint import PolicyEndpoint


class TaskSucceeded(Exception):
    """The simulator's goal check passed during a skill: the run stops here, successfully."""


class StepLimitReached(Exception):
    """The episode's or the workflow's sim-step budget is spent."""


# How many steps an uncharged stretch (a bring-up) may take at most, whatever budget is left.
UNCHARGED_ALLOWANCE = 200


@dataclass
class SkillContext:
    env: Env
    max_sim_steps: int | None = None
    images: list[tuple[str, np.ndarray]] = field(default_factory=list)  # (label, rgb) for traces
    keep_images: bool = False
    events: list[dict[str, Any]] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)  # scratch state of one run
    policies: dict[str, PolicyEndpoint] = field(default_factory=dict)  # by policy id
    # The instruction the workflow was produced for (a suite's task_prompts entry, say); None:
    # the env's own. Skills that read the task or prompt a policy use `instruction`.
    task_prompt: str | None = None
    # Policy id -> metadata_digest of the handshake its server sent this run (the identity of
    # the policy that answered), filled as each client connects.
    served: dict[str, str] = field(default_factory=dict)
    perception: Perception = "privileged"
    # Steps taken inside `uncharged()` (a bring-up): the budgets moved on by as many.
    uncharged_steps: int = 0
    # Called with a policy id before this run first connects to its server: the runner warms
    # the server there (policies/warmup.py), once per process, charged to no trial.
    before_connect: Callable[[str], None] | None = None
    # Every control step's evidence (sim/step_log.py), when the runner keeps it; `policy_reply`
    # is the reply the policy skill is applying now (None: no policy chose the step).
    step_log: StepLog | None = None
    policy_reply: int | None = None
    policy_replies: int = 0  # the replies policies gave this run, every policy node's
    _clients: dict[str, Any] = field(default_factory=dict)
    _frames: dict[tuple[str, int, int, int], CameraFrame] = field(default_factory=dict)

    def policy(self, policy_id: str):
        """A connected client for `policy_id` (one per run, closed by `close()`)."""
        # Here: the websocket client and the wire codecs only for graphs that ask a policy.
        from pytest_gap.errors import InfraFailure
        from pytest_gap.policies.client import connect_policy
        from pytest_gap.policies.wire import metadata_digest

        if policy_id not in self._clients:
            endpoint = self.policies.get(policy_id)
            if endpoint is None:
                known = ", ".join(sorted(self.policies)) or "none"
                raise InfraFailure(
                    f"policy {policy_id!r} has no server in this run (servers: {known}); add it "
                    "to the policies: registry and to benchmark.policies"
                )
            if self.before_connect is not None:
                self.before_connect(policy_id)
            client = connect_policy(
                endpoint.url,
                endpoint.protocol,
                timeout_s=endpoint.timeout_s,
                **endpoint.client_options,
            )
            self._clients[policy_id] = client
            self.served[policy_id] = metadata_digest(client.metadata)
        return self._clients[policy_id]

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    @property
    def instruction(self) -> str:
        return self.task_prompt or self.env.episode.prompt

    @property
    def cameras(self) -> tuple[str, ...]:
        """The cameras perception looks through (`perception`)."""
        return PERCEPTION_CAMERAS[self.perception]

    @property
    def goal_check(self) -> bool:
        """Whether a skill may ask the simulator's goal check (`check_success`)."""
        return self.perception == "privileged"

    @property
    def steps(self) -> int:
        return self.env.steps

    @contextlib.contextmanager
    def uncharged(self):
        """Steps taken inside are not charged to the episode's budget (nor the workflow's):
        both limits move on by as many, so what runs after still has all of them. The
        stretch itself may take up to UNCHARGED_ALLOWANCE steps, whatever budget is left."""
        env, before = self.env, self.env.steps
        base_episode, base_workflow = env.max_steps, self.max_sim_steps
        env.max_steps = base_episode + UNCHARGED_ALLOWANCE
        if base_workflow is not None:
            self.max_sim_steps = base_workflow + UNCHARGED_ALLOWANCE
        try:
            yield
        finally:
            taken = env.steps - before
            self.uncharged_steps += taken
            env.max_steps = base_episode + taken
            if base_workflow is not None:
                self.max_sim_steps = base_workflow + taken

    def check_budget(self) -> None:
        """StepLimitReached if the episode's or the workflow's budget allows no further step
        (what `act` checks first; a skill asks before it spends work on a step, e.g. a policy's
        inference)."""
        if self.max_sim_steps is not None and self.env.steps >= self.max_sim_steps:
            raise StepLimitReached(f"workflow sim-step limit {self.max_sim_steps} reached")
        if self.env.steps >= self.env.max_steps:
            raise StepLimitReached(f"episode step limit {self.env.max_steps} reached")

    def act(self, action) -> StepResult:
        """One control step through the env's 7-D action; stops the run on success or budget."""
        self.check_budget()
        log = self.step_log
        if log is not None and not len(log):
            log.start(self.env.observe(cameras=()).state)  # no camera renders for it
        result = self.env.step(action)
        if log is not None:
            log.record(
                step=result.steps,
                action=action,
                state_after=result.obs.state,
                reward=result.reward,
                done=result.success,
                reply=self.policy_reply,
            )
        if result.success:
            raise TaskSucceeded()
        return result

    def render(self, camera: str, *, height: int = 256, width: int = 256) -> CameraFrame:
        """A camera's frame now; rendered once per sim step, as skills look many times
        between two steps (every item's box, what is in the container)."""
        key = (camera, height, width, self.env.steps)
        if key not in self._frames:
            frame = self.env.scene.render(camera, height=height, width=width)
            self._frames = {key: frame, **{k: f for k, f in self._frames.items() if k[3] == key[3]}}
            if self.keep_images and frame.rgb is not None:
                self.images.append((camera, frame.rgb))
        return self._frames[key]

    def note(self, message: str, **data: Any) -> None:
        self.events.append({"message": message, "step": self.env.steps, **data})
