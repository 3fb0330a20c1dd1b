"""What a token holder can make one `gap serve` hold (issue 48, sections 1 and 2), measured.

    python bench/service_limits.py [--code DIR] [--idle 30]

`--code DIR`: the checkout whose `gap serve` is measured (default: this one; a `git worktree`
of an older commit gives the "before" column). Each server runs with its address space capped
at 3 GiB, so a plan that fills the memory ends that server, not the machine.
- work: configs of a few hundred bytes whose product of axes is huge, submitted as `gap submit`
  sends them: how long the answer took, the server's RSS growth, whether a run dir was left,
  whether the server still answers;
- on disk: such a run left in the runs dir (as an older server wrote it), then the server
  restarted: how long `GET /runs/<id>` and `/healthz` take while it is read;
- idle attachments: the operator's run on the fake backend, one client holding its one trial,
  then `--idle` more clients waiting: the server's threads and file descriptors before and
  after (`/proc`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml
from websockets.sync.client import connect

from pytest_gap.policies.wire import packb, unpackb

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.service_configs import remote_policy_config  # noqa: E402

GAP = str(Path(sys.executable).with_name("gap"))
CAP = 3 * 2**30
TOKEN = "bench-token-0123456789abcdef"
SECRET = "bench-run-secret-0123456789abcdef"


honest = remote_policy_config


WORK = {
    "issue: every posvar variation, n_tasks 1e6, n_seeds 1e5": honest(
        families=["posvar"], variations=None, task_ids=None, n_tasks=1_000_000, n_seeds=100_000
    ),
    "held out: the same with n_tasks 1e5 (within its own bound)": honest(
        families=["posvar"], variations=None, task_ids=None, n_tasks=100_000, n_seeds=100_000
    ),
    "held out: every libero_pro variation, n_seeds 5,000": honest(
        families=["libero_pro"], variations=None, task_ids=None, n_seeds=5000
    ),
    "held out: 60,000 listed seeds, one task": honest(seeds=list(range(60_000)), n_seeds=None),
    "held out: 500 trials of max_steps 90,000": {
        **honest(task_ids=list(range(10)), n_seeds=50),
        "trials": {"max_steps": 90_000},
    },
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, code: Path, home: Path, *args: str, pythonpath: str = ""):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (home / "token").write_text(TOKEN + "\n")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(code), pythonpath) if p)}
        env.update(NO_PROXY="127.0.0.1", GAP_RUN_SECRET=SECRET)
        argv = [GAP, "serve", "--port", str(self.port), "--runs-dir", str(home / "runs")]
        argv += ["--token-file", str(home / "token"), *args]
        self.log = open(home / f"serve_{self.port}.log", "w")  # noqa: SIM115 (closed in stop)
        cap = lambda: resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))  # noqa: E731
        self.process = subprocess.Popen(
            argv, stdout=self.log, stderr=subprocess.STDOUT, env=env, preexec_fn=cap
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and self.process.poll() is None:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{self.url}/healthz", timeout=1).close()
                return
            time.sleep(0.2)
        raise RuntimeError(f"gap serve did not come up: {(home / self.log.name).name}")

    def rss_mb(self, key: str = "VmRSS") -> float:
        """Its resident memory now (VmRSS), or at its peak (VmHWM), MB."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(next(x for x in status.splitlines() if x.startswith(key)).split()[1]) / 1024

    def held(self) -> tuple[int, int]:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        threads = int(next(x for x in status.splitlines() if x.startswith("Threads")).split()[1])
        return threads, len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def alive(self) -> bool:
        try:
            urllib.request.urlopen(f"{self.url}/healthz", timeout=5).close()
            return True
        except OSError:
            return False

    def submit(self, text: str, run_id: str, timeout: float = 120) -> dict:
        frame = {"op": "submit", "run_id": run_id, "config_name": "c.yaml", "config_text": text}
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with connect(f"ws://127.0.0.1:{self.port}/control", additional_headers=headers) as ws:
            ws.send(packb(frame))
            return unpackb(ws.recv(timeout=timeout))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        self.log.close()


def work(code: Path, home: Path) -> None:
    print("## work a submission asks for")
    for name, data in WORK.items():
        server = Server(code, home)
        text = yaml.safe_dump(data)
        rss, t0 = server.rss_mb("VmHWM"), time.perf_counter()
        try:
            answer = server.submit(text, "bomb")
            what = "accepted" if answer.get("ok") else "refused: " + answer["error"][:110]
        except Exception as exc:  # the server died or did not answer
            what = f"no answer ({type(exc).__name__})"
        seconds = time.perf_counter() - t0
        grew = (server.rss_mb("VmHWM") - rss) if server.process.poll() is None else float("nan")
        left = (
            sorted(p.name for p in (home / "runs" / "bomb").iterdir())
            if (home / "runs" / "bomb").is_dir()
            else []
        )
        print(
            f"- {name} ({len(text)} bytes): {what}; {seconds * 1000:.0f} ms; "
            f"peak RSS +{grew:.0f} MB; on disk {left or 'nothing'}; server alive: {server.alive()}"
        )
        server.stop()
        subprocess.run(["rm", "-rf", str(home / "runs")], check=True)


def on_disk(code: Path, home: Path) -> None:
    print("## a huge run left on disk, the server restarted")
    name, data = next(iter(WORK.items()))
    run = home / "runs" / "bomb"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(data))
    (run / "service.json").write_text(json.dumps({"run_id": "bomb", "config_name": "c.yaml"}))
    server = Server(code, home)
    health: list[float] = []

    def poll() -> None:
        t0 = time.perf_counter()
        with contextlib.suppress(OSError):
            urllib.request.urlopen(f"{server.url}/healthz", timeout=120).close()
        health.append(time.perf_counter() - t0)

    request = urllib.request.Request(
        f"{server.url}/runs/bomb", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    t0 = time.perf_counter()
    asking = threading.Thread(target=lambda: _answer(request))
    asking.start()
    time.sleep(0.5)
    poll()
    asking.join(300)
    print(
        f"- {name}: GET /runs/bomb {time.perf_counter() - t0:.1f} s ({_ANSWERS[-1]}); "
        f"/healthz meanwhile {health[-1] * 1000:.0f} ms"
    )
    server.stop()
    subprocess.run(["rm", "-rf", str(home / "runs")], check=True)


_ANSWERS: list[str] = []


def _answer(request) -> None:
    try:
        with urllib.request.urlopen(request, timeout=300) as answer:
            _ANSWERS.append(f"HTTP {answer.status}")
    except urllib.error.HTTPError as exc:
        _ANSWERS.append(f"HTTP {exc.code}: {json.loads(exc.read()).get('error', '')[:90]}")
    except OSError as exc:
        _ANSWERS.append(type(exc).__name__)


def idle(code: Path, home: Path, n: int) -> None:
    print(f"## {n} idle attachments")
    data = honest(backend="fake_backend:FakeBackend", families=["fake"], variations=["easy"])
    data["policies"]["remote"].update(timeout_s=300, warmup_timeout_s=300)
    (home / "op.yaml").write_text(yaml.safe_dump(data))
    limits = ["--max-attachments-per-run", str(n + 1), "--max-attachments", str(n + 1)]
    args = ["--config", str(home / "op.yaml"), "--run-id", "op"]
    try:
        server = Server(code, home, *args, *limits, pythonpath=str(REPO / "tests"))
    except RuntimeError:  # an older server without the options
        server = Server(code, home, *args, pythonpath=str(REPO / "tests"))
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with contextlib.ExitStack() as stack:

        def client(worker: int):
            ws = stack.enter_context(
                connect(f"ws://127.0.0.1:{server.port}/episodes", additional_headers=headers)
            )
            ws.send(packb({"run_id": "op", "worker_id": worker, "run_secret": SECRET}))
            return ws

        runner = client(0)
        unpackb(runner.recv(timeout=60))  # its trial's warm-up, left unanswered
        before = server.held()
        for worker in range(1, n + 1):
            client(worker)
        time.sleep(2)
        after = server.held()
    print(
        f"- threads {before[0]} -> {after[0]} ({(after[0] - before[0]) / n:.2f} each), "
        f"fds {before[1]} -> {after[1]} ({(after[1] - before[1]) / n:.2f} each)"
    )
    server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=Path, default=REPO)
    parser.add_argument("--idle", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        work(args.code.resolve(), home)
        on_disk(args.code.resolve(), home)
        idle(args.code.resolve(), home, args.idle)


if __name__ == "__main__":
    main()
