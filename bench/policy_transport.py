"""Policy round trip over loopback: our PolicyClient vs openpi-client's, side by side in one run.

    python bench/policy_transport.py [--calls 1000] [--warmup 50]

Starts the real CLI, `gap policy serve hold`, on a free port; opens one connection with our
PolicyClient and one with openpi-client's WebsocketClientPolicy; then alternates the two, call
by call, so machine noise hits both alike. Each call sends two 224x224x3 uint8 images, an 8-D
float32 state and a prompt, and waits for the (10, 7) action chunk. Targets (issue 13): our
median round trip <= 2 ms and <= 1.1x openpi-client's.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path

import numpy as np

TARGET_MS, TARGET_RATIO = 2.0, 1.1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve(port: int) -> subprocess.Popen:
    gap = shutil.which("gap", path=str(Path(sys.executable).parent))
    cmd = [gap] if gap else [sys.executable, "-m", "pytest_gap.cli"]
    proc = subprocess.Popen(
        [*cmd, "policy", "serve", "hold", "--port", str(port)], stdout=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                sys.exit(f"gap policy serve hold did not come up on port {port}")
            time.sleep(0.1)


def _obs(rng: np.random.Generator) -> dict:
    return {
        "observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/state": rng.normal(size=8).astype(np.float32),
        "prompt": "pick up the milk and place it in the basket",
    }


def _stats(ms: list[float]) -> tuple[float, float]:
    return statistics.median(ms), float(np.percentile(ms, 90))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="timed round trips per client")
    parser.add_argument("--warmup", type=int, default=50, help="untimed round trips first")
    args = parser.parse_args()

    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    from pytest_gap.policies.client import PolicyClient

    port = _free_port()
    server = _serve(port)
    try:
        url = f"ws://127.0.0.1:{port}"
        ours = PolicyClient(url)
        with warnings.catch_warnings():  # openpi-client 0.1.2 connects the deprecated way
            warnings.simplefilter("ignore", DeprecationWarning)
            theirs = WebsocketClientPolicy(url)
        rng = np.random.default_rng(0)
        # A few distinct observations, made up front: the timed loop measures transport only.
        observations = [_obs(rng) for _ in range(8)]
        times: dict[str, list[float]] = {"ours": [], "openpi-client": []}
        clients = {"ours": ours.infer, "openpi-client": theirs.infer}
        for i in range(args.warmup + args.calls):
            obs = observations[i % len(observations)]
            order = list(clients) if i % 2 == 0 else list(reversed(clients))
            for name in order:
                t0 = time.perf_counter()
                reply = clients[name](obs)
                elapsed = (time.perf_counter() - t0) * 1000
                if reply["actions"].shape != (10, 7):
                    sys.exit(f"{name}: unexpected reply {reply}")
                if i >= args.warmup:
                    times[name].append(elapsed)
        ours.close()
        theirs._ws.close()
    finally:
        server.terminate()
        server.wait(10)

    obs_bytes = sum(v.nbytes for v in observations[0].values() if isinstance(v, np.ndarray))
    print(
        f"round trip through `gap policy serve hold`, loopback, {args.calls} calls each "
        f"(after {args.warmup} warm-up), interleaved; observation {obs_bytes / 1024:.0f} KiB"
    )
    medians = {}
    for name, ms in times.items():
        median, p90 = _stats(ms)
        medians[name] = median
        print(f"{name:14s} median {median:6.3f} ms   p90 {p90:6.3f} ms   min {min(ms):6.3f} ms")
    ratio = medians["ours"] / medians["openpi-client"]
    paired = statistics.median(a / b for a, b in zip(*times.values(), strict=True))
    print(f"ratio ours / openpi-client (medians): {ratio:.3f}   (per-pair ratios: {paired:.3f})")
    fast, close = medians["ours"] <= TARGET_MS, ratio <= TARGET_RATIO
    print(f"target ours <= {TARGET_MS:g} ms: {'MET' if fast else 'MISSED'}")
    print(f"target ratio <= {TARGET_RATIO:g}: {'MET' if close else 'MISSED'}")
    return 0 if fast and close else 1


if __name__ == "__main__":
    sys.exit(main())
