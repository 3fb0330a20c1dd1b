"""The data plane of `gap serve` (server.py): attached clients, each with a simulator slot and a
relay (relay.py), within the server's limits (limits.py).

An attachment is admitted before anything is made for it: its worker id within 0 ..
`max_attachments_per_run` - 1, not refused, not attached already, and the run and the server
under their attachment limits (those gone but still ending a trial count: they hold a slot).
Then it costs its websocket, a relay entry, and once it runs a trial one thread (the slot's: a
GL context belongs to the thread that made it) with its env. Its connection is watched while it
waits for a trial and while it runs one: a client that closes is detached at once, and its
relay fails the trial's next inference at once. How a trial that ended unscored goes out again,
and when a worker is refused, is runs.py's (`ServiceRun.finish`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from websockets.asyncio.server import ServerConnection

from pytest_gap import ids
from pytest_gap.cells import Trial
from pytest_gap.layout import SMOKE_DIR
from pytest_gap.policies.wire import packb
from pytest_gap.run.trial import TrialRun
from pytest_gap.service.limits import OPTION, ServiceLimits
from pytest_gap.service.protocol import Hello, RunRefused, WorkerStatus
from pytest_gap.service.relay import GONE, Relay, RelayHub, lost
from pytest_gap.service.runs import ServiceRun
from pytest_gap.sim.pool import EnvPool

log = logging.getLogger(__name__)
IDLE_POLL_S = 0.5  # a worker with nothing to claim looks again this often (or when it closes)


class _OneBuildAtATime:
    """A slot's env pool whose env creation takes a lock shared by every slot: two threads
    importing a simulator at once break its imports (robosuite's `controllers` package raised
    a circular ImportError when two slots made their first env together)."""

    def __init__(self, pool, lock: threading.Lock):
        self.pool, self.lock = pool, lock

    def get(self, *args, **kwargs):
        with self.lock:
            return self.pool.get(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.pool, name)


class Attachment:
    """One attached client: its status line, relay (at `url`), and slot (a thread made at its
    first trial, and its env pool); `closed` is done once its connection is lost, `stop` says
    why the server lets it go (a fault of the server's own, not the client's)."""

    def __init__(self, ws: ServerConnection, hello: Hello, run: ServiceRun, **held):
        self.ws, self.hello, self.run = ws, hello, run
        self.status: WorkerStatus = held["status"]
        self.relay: Relay = held["relay"]
        self.url: str = held["url"]
        self.pool: _OneBuildAtATime = held["pool"]
        self.closed = lost(ws)
        self.slot: ThreadPoolExecutor | None = None
        self.stop: str | None = None

    def gone(self) -> None:
        """Its connection is lost: detached now, and its relay fails every later inference."""
        self.relay.fail(GONE)
        if self.status.state == "attached":
            self.status.state, self.status.reason = "detached", GONE


class Slots:
    """The server's attached clients: their status lines (`workers`, kept per run and worker
    id), relays, slots. `write_summary(run)` writes an ended run's outputs (the server's)."""

    def __init__(self, limits: ServiceLimits, write_summary: Callable[[ServiceRun], None]):
        self.limits, self.write_summary = limits, write_summary
        self.hub = RelayHub()
        self._building = threading.Lock()
        self.workers: dict[tuple[str, int], WorkerStatus] = {}
        self.relays: dict[tuple[str, int], Relay] = {}  # each worker's latest (for its replies)
        self.attached: set[Attachment] = set()  # those whose handler still runs

    def within_limits(self, hello: Hello, run: ServiceRun) -> None:
        """RunRefused, naming the option, when attaching `hello` would pass a limit."""
        per_run, total = self.limits.max_attachments_per_run, self.limits.max_attachments
        worker = hello.worker_id
        if worker >= per_run:
            raise RunRefused(
                f"worker id {worker}: this server takes worker ids 0 to {per_run - 1} per run "
                f"({OPTION['max_attachments_per_run']} {per_run}); give each client one of them"
            )
        if worker in run.refused:
            raise RunRefused(run.refused[worker])
        live = self.workers.get((hello.run_id, worker))
        if live is not None and live.state == "attached":
            raise RunRefused(
                f"worker id {worker} of run {hello.run_id} is already attached "
                f"(from {live.host or 'another client'}); give each client its own worker id"
            )
        mine = sum(a.run is run for a in self.attached)
        if mine >= per_run:  # those gone but still ending a trial count too: they hold a slot
            raise RunRefused(
                f"run {run.run_id} has {mine} clients attached or ending a trial, the most "
                f"{OPTION['max_attachments_per_run']} ({per_run}) allows; attach when one ends"
            )
        if len(self.attached) >= total:
            raise RunRefused(
                f"this server has {len(self.attached)} clients attached, the most "
                f"{OPTION['max_attachments']} ({total}) allows; attach later"
            )

    def attach(self, ws: ServerConnection, hello: Hello, run: ServiceRun) -> Attachment:
        """Register an admitted client (no await since its admission: the limits hold)."""
        key = (hello.run_id, hello.worker_id)
        live = self.workers.get(key)
        status = WorkerStatus(
            worker_id=hello.worker_id,
            state="attached",
            host=hello.host,
            smoke=hello.smoke,
            episodes_done=live.episodes_done if live else 0,
        )
        self.workers[key] = status
        entry = run.entry
        relay = Relay(ws, hello.metadata, entry.timeout_s, entry.warmup_timeout_s)
        self.relays[key] = relay
        pool = _OneBuildAtATime(EnvPool(max_envs=1), self._building)
        attachment = Attachment(
            ws, hello, run, status=status, relay=relay, url=self.hub.open(relay), pool=pool
        )
        self.attached.add(attachment)
        return attachment

    async def detach(self, attachment: Attachment) -> None:
        """Release what the attachment held (its relay, its slot's env and thread)."""
        status, run = attachment.status, attachment.run
        refused = run.refused.get(attachment.hello.worker_id)
        if refused:
            status.state, status.reason = "refused", refused
        elif status.state == "attached":
            status.state = "detached"
            status.reason = attachment.relay.broken
        status.current = None
        self.hub.close(attachment.url)
        try:
            if attachment.slot is not None:  # its env is closed on the thread it lives on
                await asyncio.get_running_loop().run_in_executor(
                    attachment.slot, attachment.pool.close
                )
        finally:
            if attachment.slot is not None:
                attachment.slot.shutdown(wait=False)
            self.attached.discard(attachment)

    async def serve(self, attachment: Attachment) -> None:
        """The attached client's episodes: its smoke episode, or the run's trials it claims
        until none is left, it goes away or it is refused; then the finished frame (and the
        run's summary when it ended), or the reason it was let go."""
        hello, run = attachment.hello, attachment.run
        if hello.smoke:
            await self._in_slot(attachment, run.run_dir / SMOKE_DIR, run.smoke_trial())
            run.smoke_episodes += 1
        while not hello.smoke and not self._let_go(attachment):
            trial = run.claim(hello.worker_id)
            if trial is None:
                if run.ended or not run.in_progress:
                    break
                # another client's episode may come back; this one's close ends the wait
                await asyncio.wait({attachment.closed}, timeout=IDLE_POLL_S)
                continue
            await self._one_trial(attachment, trial)
        if run.ended:  # whoever gets here first writes its outputs, however it ends
            await asyncio.to_thread(self.write_summary, run)
        why = self._let_go(attachment)
        if why is not None:
            if not attachment.closed.done():
                await attachment.ws.send(packb({"type": "error", "error": why}))
            return
        await attachment.ws.send(
            packb(
                {
                    "type": "finished",
                    "smoke": hello.smoke,
                    "expected": len(run.trials),
                    "saved": len(run.saved),
                }
            )
        )

    @staticmethod
    def _let_go(attachment: Attachment) -> str | None:
        """Why the attachment takes no more trials (its client gone or failed, or the server's
        own fault), or None."""
        if attachment.closed.done():
            attachment.gone()
        worker = attachment.hello.worker_id
        return attachment.relay.broken or attachment.stop or attachment.run.refused.get(worker)

    async def _one_trial(self, attachment: Attachment, trial: Trial) -> None:
        run, status, worker = attachment.run, attachment.status, attachment.hello.worker_id
        status.current = trial.key
        harness = None
        try:
            harness = await self._in_slot(attachment, run.run_dir, trial)
        finally:  # whatever happened, the trial is saved or handed out again
            client = None if harness else attachment.relay.broken  # the server's is not its
            run.finish(trial.key, worker, harness_error=harness, client=client)
            status.current = None
        status.episodes_done += trial.key in run.saved

    async def _in_slot(self, attachment: Attachment, run_dir: Path, trial: Trial) -> str | None:
        """Run `trial` into `run_dir` on the attachment's slot thread, the client as its policy,
        watching the client's connection meanwhile (gone: detached at once). Returns why the
        server itself could not run it (no thread, no memory), or None: a resource failure of
        the server is never the trial's record, let alone a scored one."""
        loop = asyncio.get_running_loop()
        worker = attachment.hello.worker_id
        try:
            if attachment.slot is None:  # one thread per slot: its env's GL context lives on it
                attachment.slot = ThreadPoolExecutor(1, thread_name_prefix=f"gap-slot-{worker}")
            running = loop.run_in_executor(
                attachment.slot, self._run_trial, attachment, run_dir, trial
            )
        except (RuntimeError, MemoryError, OSError) as exc:
            why = f"the server could not start a trial: {type(exc).__name__}: {exc}"
            attachment.stop = f"{why}; attach again later"
            return why
        done, _ = await asyncio.wait(
            {running, attachment.closed}, return_when=asyncio.FIRST_COMPLETED
        )
        if running not in done:
            attachment.gone()  # its trial ends at its next inference, which fails at once
        try:
            await running
        except Exception as exc:  # outside the trial's own record keeping: the server's
            log.warning("run %s: %s: %s", attachment.run.run_id, trial.key, exc)
            return f"the server could not run the trial: {type(exc).__name__}: {exc}"
        return None

    def _run_trial(self, attachment: Attachment, run_dir: Path, trial: Trial) -> None:
        run = attachment.run
        config = run.card["config_name"]
        TrialRun(
            trial,
            run_dir,
            nodeid=ids.node_id(config, trial.id),
            config=config,
            pool=attachment.pool,
            worker=f"service-{attachment.hello.worker_id}",
            policies={run.policy_id: run.endpoint(attachment.url)},
        ).execute()
