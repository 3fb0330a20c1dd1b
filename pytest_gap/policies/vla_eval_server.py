"""Serve a policy over vla-evaluation-harness's protocol, with vla-eval's own server.

The contract is vla-eval's code, not a copy of it: the policy is wrapped in a subclass of
`vla_eval.model_servers.predict.PredictModelServer` and served by vla-eval's `serve_async`, so
the HELLO handshake, the message framing, the errors and `GET /health` are exactly what
vla-eval's benchmarks and `vla_eval.connection.Connection` expect. vla-eval is an optional
dependency, imported only when such a server is built.

What the adapter adds, and why:
- vla-eval's LIBERO benchmark applies one 7-D action per observation, while our policies reply
  with (H, 7) chunks. PredictModelServer's chunk buffer hands a chunk out one action per
  observation and asks the policy again when it is empty; the whole chunk a policy returns is
  executed (no trimming), as the policy asked. vla-eval empties the buffer at EPISODE_START.
- A policy with `fork()` (policies/builtin.py: replay) keeps per-episode state. vla-eval makes
  one SessionContext per episode (a new one at each EPISODE_START; one per connection before
  the first), so a fork lives with its context: every episode starts from a fresh state, two
  connections never share one, and a closed connection's state goes with its context.
- A policy that reads privileged simulator state (scripted) is refused: only pytest-gap's own
  run_policy sends that state, never a vla-eval benchmark.
- The HELLO reply's `observation_params` are vla-eval's defaults (none asked for): the
  built-ins read nothing of the observation but what vla-eval's LIBERO benchmark always sends.
- `max_batch_size` > 1 is PredictModelServer's own batching: its queue gathers the
  observations of several connections (up to the size, or what came within `max_wait_time`)
  into one `predict_batch`, answered by the policy's `infer_batch`, with the openpi server's
  refusals (`check_batchable`: no infer_batch, or per-connection state).
- A browser's request is refused with 403 before vla-eval sees it (doors.py): its websocket
  handshakes, and its `GET /config?max_batch_size=...`, which reconfigures the server and which
  any web page could send. vla-eval's runner calls websockets' `serve` by the module name
  `ws_serve`; for the life of `serve` below that name is websockets' own `serve` with our
  check in front of vla-eval's `process_request` (vla-eval's code is not changed).
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from pytest_gap.bind import exposure_notice
from pytest_gap.doors import refuse_browsers
from pytest_gap.errors import GapError

NEEDS_VLA_EVAL = (
    "gap policy serve --protocol vla-eval needs vla-eval (pip install 'pytest-gap[vla-eval]')"
)
# PredictModelServer trims each chunk to chunk_size before buffering it; a bound no chunk
# reaches keeps every action the policy returned.
WHOLE_CHUNK = sys.maxsize
log = logging.getLogger(__name__)


class _PolicyAdapter:
    """The policy side of the model server; combined with PredictModelServer by
    `model_server`, which is what vla-eval's server runner calls."""

    def __init__(
        self, policy: Any, name: str, max_batch_size: int = 1, max_wait_ms: float = 5.0
    ) -> None:
        if getattr(policy, "needs_privileged_state", False):
            raise GapError(
                f"policy {name!r} reads privileged simulator state, which only pytest-gap's own "
                "run_policy sends (openpi protocol, privileged_state: true) and no vla-eval "
                "benchmark does: serve it with --protocol openpi"
            )
        from pytest_gap.policies.server import check_batchable

        check_batchable(policy, max_batch_size)
        # max_batch_size 1: one predict() at a time; above, PredictModelServer's own queue
        # gathers observations of several connections for one predict_batch()
        super().__init__(
            chunk_size=WHOLE_CHUNK,
            max_batch_size=max_batch_size,
            max_wait_time=max_wait_ms / 1000,
        )
        self.batch_sizes: list[int] = []  # for inspection: the size of every batch inferred
        self.policy, self.name = policy, name
        self._forks: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self._forks_lock = threading.Lock()  # predict() runs in a worker thread

    def _episode_policy(self, ctx: Any) -> Any:
        fork = getattr(self.policy, "fork", None)
        if not callable(fork):
            return self.policy
        with self._forks_lock:
            policy = self._forks.get(ctx)
            if policy is None:
                policy = self._forks[ctx] = fork()
            return policy

    def predict(self, obs: dict, ctx: Any) -> dict:
        reply = self._episode_policy(ctx).infer(obs)
        return {"actions": _chunk(reply, self.name)}

    async def on_serve_start(self, tg: Any) -> None:
        await super().on_serve_start(tg)
        if self.max_batch_size > 1:
            tg.start_soon(self._close_batch_queue_at_end)

    async def _close_batch_queue_at_end(self) -> None:
        """PredictModelServer leaves its batch queue's memory streams open when its server's
        task group ends (a ResourceWarning when they are collected): closed here, then."""
        import anyio

        try:
            await anyio.sleep_forever()
        finally:
            for stream in (self._send_stream, self._receive_stream):
                if stream is not None:
                    stream.close()

    def predict_batch(self, obs_batch: list[dict], ctx_batch: list[Any]) -> list[dict]:
        """One infer_batch call for observations of several connections (max_batch_size > 1:
        the policy keeps no per-episode state, check_batchable)."""
        self.batch_sizes.append(len(obs_batch))
        replies = list(self.policy.infer_batch(list(obs_batch)))
        if len(replies) != len(obs_batch):
            raise RuntimeError(
                f"policy {self.name!r}: infer_batch returned {len(replies)} replies for "
                f"{len(obs_batch)} observations"
            )
        return [{"actions": _chunk(reply, self.name)} for reply in replies]

    async def on_episode_end(self, result: dict, ctx: Any) -> None:
        with self._forks_lock:
            self._forks.pop(ctx, None)  # now, not when the context is collected
        await super().on_episode_end(result, ctx)


def _chunk(reply: Any, name: str) -> np.ndarray:
    """The (H, 7) actions of a policy's reply; anything else is the policy's error, which
    vla-eval's server answers as an ERROR message on that connection only."""
    actions = reply.get("actions") if isinstance(reply, dict) else None
    if actions is None:
        raise ValueError(f"policy {name!r} replied without actions")
    actions = np.asarray(actions, dtype=np.float32)
    if actions.ndim == 1:
        actions = actions[None]
    if actions.ndim != 2 or actions.shape[1] != 7 or len(actions) == 0:
        shape = list(actions.shape)
        raise ValueError(f"policy {name!r} replied actions of shape {shape}, not (H, 7)")
    return actions


@functools.cache
def _server_class() -> type:
    try:
        from vla_eval.model_servers.predict import PredictModelServer
    except ImportError:
        raise GapError(NEEDS_VLA_EVAL) from None

    class GapPolicyServer(_PolicyAdapter, PredictModelServer):
        """A pytest-gap policy as a vla-eval model server (this name is the HELLO reply's
        `model_server`)."""

    return GapPolicyServer


def model_server(policy: Any, name: str, max_batch_size: int = 1, max_wait_ms: float = 5.0):
    """`policy` (anything with infer(obs) -> {"actions": (H, 7)}) as a vla-eval ModelServer;
    `max_batch_size` > 1 batches observations across connections (the policy's infer_batch),
    waiting at most `max_wait_ms` for a batch to fill."""
    return _server_class()(policy, name, max_batch_size, max_wait_ms)


def _guarded(process_request: Any) -> Any:
    """vla-eval's `process_request`, behind the refusal of a browser's request."""

    def guarded(connection: Any, request: Any) -> Any:
        refused = refuse_browsers(connection, request)
        if refused is not None or process_request is None:
            return refused
        return process_request(connection, request)

    return guarded


def guarded_ws_serve(listening: Callable[[int], None] | None = None) -> Any:
    """websockets' `serve`, with every request a browser made refused first, frames above
    the server's message limit refused by the websocket layer (vla-eval asks for no limit) and
    one frame read ahead per connection (wire.MAX_QUEUED_FRAMES), as our own server reads.
    `listening` gets the port once it is bound (vla-eval's runner enters the server with
    `async with`)."""
    from websockets.asyncio.server import serve as ws_serve

    from pytest_gap.policies.server import DEFAULT_MAX_MESSAGE_MB
    from pytest_gap.policies.wire import MAX_QUEUED_FRAMES

    def serve(handler: Any, *args: Any, process_request: Any = None, **kwargs: Any) -> Any:
        kwargs |= {"max_size": DEFAULT_MAX_MESSAGE_MB * 2**20, "max_queue": MAX_QUEUED_FRAMES}
        inner = ws_serve(handler, *args, process_request=_guarded(process_request), **kwargs)
        return inner if listening is None else _Announced(inner, listening)

    return serve


class _Announced:
    """websockets' server context, calling `listening(port)` once it is bound."""

    def __init__(self, inner: Any, listening: Callable[[int], None]):
        self._inner, self._listening = inner, listening

    async def __aenter__(self) -> Any:
        server = await self._inner.__aenter__()
        self._listening(server.sockets[0].getsockname()[1])
        return server

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._inner.__aexit__(*exc)


def bounded_unpack(unpack_message: Any) -> Any:
    """vla-eval's `unpack_message`, behind wire.py's bounded decoding of the same frame
    (objects, depth, strings, dtypes, image headers): a hostile frame costs what reading it
    costs, one warning line, and that connection only (it ends as a closed connection does,
    which vla-eval's handler logs in one line of its own, no traceback)."""
    from websockets.exceptions import ConnectionClosedError
    from websockets.frames import Close

    from pytest_gap.policies.wire import WireError, unpack_vla

    def unpack(raw: Any) -> Any:
        try:
            unpack_vla(raw)
        except WireError as exc:
            why = " ".join(str(exc).split())
            log.warning("refused a frame: %s", why)
            raise ConnectionClosedError(Close(1008, why[:120]), None) from None
        return unpack_message(raw)

    return unpack


def serve(
    server: Any, host: str, port: int, listening: Callable[[int], None] | None = None
) -> None:
    """Serve a `model_server(...)` with vla-eval's runner in the foreground until interrupted;
    `listening` gets the port once it is bound."""
    import vla_eval.model_servers.serve as runner
    from websockets.asyncio.server import serve as ws_serve

    if getattr(runner, "ws_serve", None) is not ws_serve:
        raise GapError(
            "vla-eval's server runner no longer serves through websockets' serve as `ws_serve`: "
            "pytest-gap cannot put its browser check in front of it; install the vla-eval "
            "version pytest-gap pins"
        )
    notice = exposure_notice("the policy server", host)
    if notice:
        log.warning(notice)
    unpack_message = runner.unpack_message
    # this process serves this one server, for life
    runner.ws_serve = guarded_ws_serve(listening)
    runner.unpack_message = bounded_unpack(unpack_message)
    try:
        runner.serve(server, host=host, port=port)
    finally:
        runner.ws_serve, runner.unpack_message = ws_serve, unpack_message
