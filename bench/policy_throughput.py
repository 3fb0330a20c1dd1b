"""A learned network served batched and unbatched: requests/s and latency with 1, 2, 4 and 8
clients replaying recorded observations, side by side in one run.

    python bench/policy_throughput.py [--seconds 8] [--clients 1,2,4,8] [--batch 8]
                                      [--threads 1] [--checkpoint FILE]

The network is examples/policies/visuomotor.py (its untrained weights unless --checkpoint:
inference costs the same). Observations are recorded once from real LIBERO in the `gap` format
(both cameras at 256 px, the state, the prompt), then replayed: on 2 CPU cores an episode is
render-bound, so only clients that do not render show what the server can do. Two servers run
as `gap policy serve torch` processes, one with --max-batch-size 1 and one with --max-batch-size
N; for each client count the two are measured in turn, `--seconds` each, twice, alternating
(the machine's noise falls on both). Each client is a thread with its own connection (one
episode each, as the harness opens them), sending the next observation as soon as the last
reply came.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench/ and examples/ beside the package

from bench.policy_transport import _free_port  # noqa: E402
from pytest_gap.policies.client import PolicyClient  # noqa: E402
from pytest_gap.policies.formats import GapFormat  # noqa: E402
from pytest_gap.sim.backend import EnvOptions  # noqa: E402
from pytest_gap.sim.libero import make_env  # noqa: E402

FACTORY = "examples.policies.visuomotor:VisuomotorPolicy"


def record_observations(n: int) -> list[dict]:
    """`n` gap-format observations along a random walk of libero_object task 0."""
    rng = np.random.default_rng(0)
    out = []
    with make_env("libero_object", 0, EnvOptions(max_steps=n * 5)) as env:
        env.reset(0)
        for _ in range(n):
            out.append(GapFormat().observation(env, env.episode.prompt, {}))
            for _ in range(5):
                env.step(rng.uniform(-0.5, 0.5, 7))
    return out


def checkpoint(path: Path) -> Path:
    import torch

    from examples.policies.visuomotor import VisuomotorPolicy
    from pytest_gap.policies.torch_policy import save_checkpoint

    torch.manual_seed(0)
    save_checkpoint(path, VisuomotorPolicy(), factory=FACTORY)
    return path


def serve(ckpt: Path, batch: int, threads: int):
    import subprocess
    import urllib.request

    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "pytest_gap.cli", "policy", "serve", "torch"]
    command += ["--checkpoint", str(ckpt), "--port", str(port), "--threads", str(threads)]
    command += ["--max-batch-size", str(batch), "--max-wait-ms", "5"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return proc, f"ws://127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise SystemExit(
                    f"gap policy serve torch (batch {batch}) did not come up"
                ) from None
            time.sleep(0.2)


def load(url: str, observations: list[dict], clients: int, seconds: float):
    """Requests/s over all clients and each request's latency (s)."""
    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    ready = threading.Barrier(clients)

    def client(k: int) -> None:
        mine = []
        with PolicyClient(url) as policy:
            policy.infer(observations[k % len(observations)])  # the connection's first: warm
            ready.wait()
            i = k
            while time.monotonic() < stop:
                start = time.perf_counter()
                policy.infer(observations[i % len(observations)])
                mine.append(time.perf_counter() - start)
                i += 1
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(latencies) / seconds, latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--clients", default="1,2,4,8")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--checkpoint", type=Path)
    args = parser.parse_args()
    observations = record_observations(16)
    ckpt = args.checkpoint or checkpoint(Path(tempfile.mkdtemp()) / "visuomotor.pt")
    servers = {1: serve(ckpt, 1, args.threads), args.batch: serve(ckpt, args.batch, args.threads)}
    try:
        print(f"{FACTORY}, {args.threads} torch thread(s), {os.cpu_count()} cores")
        print("clients  batch  requests/s  p50 ms  p95 ms")
        for clients in (int(c) for c in args.clients.split(",")):
            found: dict[int, tuple[list[float], list[float]]] = {b: ([], []) for b in servers}
            for _ in range(2):
                for batch, (_, url) in servers.items():
                    rate, lat = load(url, observations, clients, args.seconds / 2)
                    found[batch][0].append(rate)
                    found[batch][1].extend(lat)
            rates = {}
            for batch, (rate, lat) in found.items():
                rates[batch] = statistics.mean(rate)
                q = np.quantile(lat, [0.5, 0.95]) * 1e3
                print(f"{clients:7d}  {batch:5d}  {rates[batch]:10.1f}  {q[0]:6.1f}  {q[1]:6.1f}")
            print(f"         batched/unbatched x{rates[args.batch] / rates[1]:.2f}")
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
