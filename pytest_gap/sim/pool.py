"""A per-process pool of envs: one per (backend, suite, task, options, EGL device), LRU-bounded.

An env costs about 2 GB and seconds to build; a reset costs a fraction of a second. Trials of
one task reuse its env; a new task reuses a pooled env if it has one and otherwise evicts the
least recently used. The capacity defaults to GAP_ENV_POOL_SIZE (2). An env a fault may have
left broken (its renderers, its sim) is thrown away with `discard`: the next trial of its task
builds a fresh one.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from dataclasses import dataclass

from pytest_gap.errors import SimInputError
from pytest_gap.sim.backend import DEFAULT_BACKEND, Backend, Env, EnvOptions, get_backend

DEFAULT_POOL_SIZE = 2

log = logging.getLogger(__name__)


@dataclass
class PoolStats:
    created: int = 0
    reused: int = 0
    evicted: int = 0
    discarded: int = 0


def _capacity_from_env() -> int:
    raw = os.environ.get("GAP_ENV_POOL_SIZE", str(DEFAULT_POOL_SIZE))
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise SimInputError(f"GAP_ENV_POOL_SIZE={raw!r}: set it to a whole number >= 1")
    return value


class EnvPool:
    def __init__(self, max_envs: int | None = None):
        self.max_envs = max_envs if max_envs is not None else _capacity_from_env()
        if self.max_envs < 1:
            raise SimInputError(f"env pool size {self.max_envs}: must be >= 1")
        self._envs: OrderedDict[tuple, Env] = OrderedDict()
        self.stats = PoolStats()

    def get(
        self,
        suite: str,
        task_id: int,
        options: EnvOptions | None = None,
        egl_device: int | None = None,
        *,
        backend: Backend | str = DEFAULT_BACKEND,
    ) -> Env:
        """The pooled env of `backend` (a Backend or its name); `egl_device` is where it
        renders (an env never changes device)."""
        if isinstance(backend, str):
            backend = get_backend(backend)
        options = options or EnvOptions()
        key = (backend.name, suite, task_id, options, egl_device)
        env = self._envs.get(key)
        if env is not None:
            self._envs.move_to_end(key)
            self.stats.reused += 1
            return env
        backend.task_prompt(suite, task_id)  # validates suite and task before evicting anything
        while len(self._envs) >= self.max_envs:
            _, old = self._envs.popitem(last=False)
            old.close()
            self.stats.evicted += 1
        env = backend.make_env(suite, task_id, options, egl_device)
        self._envs[key] = env
        self.stats.created += 1
        return env

    def discard(self, env: Env) -> None:
        """Take `env` out of the pool and close it: a fault was raised in it, and whatever state
        it carries (a renderer, a half-stepped sim) must not reach another trial. Closing a
        broken env may fail too; that is logged, never raised (the trial goes on without it)."""
        for key, pooled in list(self._envs.items()):
            if pooled is env:
                del self._envs[key]
                self.stats.discarded += 1
                break
        try:
            env.close()
        except Exception as exc:  # a broken env: any exception its close raises
            log.warning(
                "env pool: closing a discarded env failed (%s: %s)", type(exc).__name__, exc
            )

    def __len__(self) -> int:
        return len(self._envs)

    def close(self) -> None:
        while self._envs:
            _, env = self._envs.popitem()
            env.close()


_pool: EnvPool | None = None


def env_pool() -> EnvPool:
    """This process's pool (one per pytest-xdist worker)."""
    global _pool
    if _pool is None:
        _pool = EnvPool()
    return _pool
