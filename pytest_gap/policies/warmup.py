"""One warm-up inference per policy server and process, before the first measured trial there.

openpi compiles its model on the first inference: on a cold server that takes far longer than a
measured reply may (`policies.<id>.timeout_s`, default 30 s), so without a warm-up the first
trial of every worker would be an infrastructure error, its cell errored and the gate failed.
The reference loops do not warm (openpi's first episode pays for the compile inside it);
Refractal asks its users to warm their servers. Here the harness does it: the first time a
process connects to a server (by url: a managed server restarted on a new port is a new one),
it first sends that server one inference with the trial's real observation, on its own
connection, under its own limit (`policies.<id>.warmup_timeout_s`, default 300 s). Nothing of
it is applied to the scene. The caller charges it to no trial and records it (run/trial.py: the
run dir's `warmup/`).
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any

from pytest_gap.policies.client import connect_policy
from pytest_gap.policies.endpoint import PolicyEndpoint
from pytest_gap.policies.formats import obs_format
from pytest_gap.sim.backend import WarmUp

if TYPE_CHECKING:
    from pytest_gap.sim.libero import LiberoEnv

# The vla-eval episode a warm-up is, in the shape vla-eval's loop starts one, so a server can tell.
WARMUP_EPISODE = {"task": {"warm_up": True}}


class WarmedServers:
    """The policy servers (urls) this process has sent its warm-up to: with the env pool, the
    per-process state a worker keeps between trials."""

    def __init__(self) -> None:
        self._urls: set[str] = set()

    def __contains__(self, url: str) -> bool:
        return url in self._urls

    def add(self, url: str) -> None:
        self._urls.add(url)

    def clear(self) -> None:
        self._urls.clear()


@functools.cache
def warmed_servers() -> WarmedServers:
    """This process's WarmedServers."""
    return WarmedServers()


def warm_up(
    endpoint: PolicyEndpoint,
    env: LiberoEnv,
    prompt: str,
    *,
    extra: dict[str, Any] | None = None,
) -> WarmUp:
    """Send `endpoint`'s server one inference of `env`'s current observation in its
    `obs_format` (plus `extra`, e.g. an oracle's privileged state), on a connection of its own
    with `warmup_timeout_s` to answer, and return how long it took. The reply is discarded.
    Raises PolicyTransportError (an infrastructure failure) if the server does not answer."""
    t0 = time.perf_counter()
    client = connect_policy(
        endpoint.url,
        endpoint.protocol,
        timeout_s=endpoint.warmup_timeout_s,
        **endpoint.client_options,
    )
    try:
        obs = obs_format(endpoint).observation(env, prompt, client.metadata)
        obs.update(extra or {})
        if endpoint.protocol == "vla-eval":
            client.episode_start(dict(WARMUP_EPISODE))
        asked = time.perf_counter()
        client.infer(obs)
        inference_s = time.perf_counter() - asked
        if endpoint.protocol == "vla-eval":
            client.episode_end(dict(WARMUP_EPISODE))
    finally:
        client.close()
    return WarmUp(
        url=endpoint.url,
        seconds=time.perf_counter() - t0,
        inference_s=inference_s,
        info={"protocol": endpoint.protocol, "obs_format": endpoint.obs_format},
    )
