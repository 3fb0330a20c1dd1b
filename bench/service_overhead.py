"""Wall time of the same episodes through the evaluation service and through pytest.

    python bench/service_overhead.py [--trials 4] [--steps 60] [--rounds 2]

Both sides run libero_object tasks 0.., seed 0, the `policy_only` template, the built-in `hold`
policy served once by `gap policy serve hold` (zero motion: every episode runs to --steps):
- pytest: `python -m pytest CONFIG` with the policy's url in the registry (collection, items,
  reports, summary, gate), one process;
- service: `gap serve` already up; timed from `gap submit` to the end of `gap eval` (one worker
  id, one client process bridging to the same policy server).
Rounds alternate the two sides so machine noise hits both. Target (issue 18): ratio <= 1.15.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

GAP = str(Path(sys.executable).with_name("gap"))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _up(url: str) -> None:
    for _ in range(300):
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not come up")


def _config(path: Path, policy_url: str, trials: int, steps: int) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "policies": {"hold": {"url": policy_url, "obs_format": "gap"}},
                "trials": {"max_steps": steps, "output_dir": str(path.parent / "pytest_runs")},
                "benchmark": {
                    "families": ["libero"],
                    "variations": ["object"],
                    "modes": ["policy_only"],
                    "policies": ["hold"],
                    "task_ids": list(range(trials)),
                    "n_seeds": 1,
                    "gate_threshold": 0.0,
                    "mode_overrides": {"policy_only": {"template": "policy_only"}},
                },
            }
        )
    )
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gap-service-bench-") as tmp:
        home = Path(tmp)
        policy_port, server_port = _port(), _port()
        policy = subprocess.Popen(
            [GAP, "policy", "serve", "hold", "--port", str(policy_port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        server = subprocess.Popen(
            [GAP, "serve", "--port", str(server_port), "--runs-dir", str(home / "service_runs")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _up(f"http://127.0.0.1:{policy_port}/healthz")
            _up(f"http://127.0.0.1:{server_port}/healthz")
            config = _config(
                home / "bench.yaml", f"ws://127.0.0.1:{policy_port}", args.trials, args.steps
            )
            walls: dict[str, list[float]] = {"pytest": [], "service": []}
            for r in range(args.rounds):
                order = ["pytest", "service"] if r % 2 == 0 else ["service", "pytest"]
                for side in order:
                    t0 = time.perf_counter()
                    if side == "pytest":
                        subprocess.run(
                            [
                                sys.executable,
                                "-m",
                                "pytest",
                                str(config),
                                "-q",
                                "-p",
                                "no:cacheprovider",
                            ],
                            cwd=home,
                            check=False,
                            capture_output=True,
                        )
                    else:
                        run_id = f"bench{r}"
                        url = f"http://127.0.0.1:{server_port}"
                        subprocess.run(
                            [
                                GAP,
                                "submit",
                                str(config),
                                "--run-id",
                                run_id,
                                "--port",
                                str(server_port),
                            ],
                            check=True,
                            capture_output=True,
                        )
                        subprocess.run(
                            [
                                GAP,
                                "eval",
                                "--url",
                                url,
                                "--run-id",
                                run_id,
                                "--policy",
                                f"ws://127.0.0.1:{policy_port}",
                            ],
                            check=True,
                            capture_output=True,
                        )
                    walls[side].append(time.perf_counter() - t0)
                    print(f"round {r} {side:8s} {walls[side][-1]:6.1f} s", flush=True)
        finally:
            for process in (server, policy):
                process.terminate()
                process.wait(timeout=30)
    p, s = statistics.median(walls["pytest"]), statistics.median(walls["service"])
    n = args.trials
    print(f"pytest : {p:6.1f} s for {n} episodes ({60 * n / p:.1f} episodes/min)")
    print(f"service: {s:6.1f} s for {n} episodes ({60 * n / s:.1f} episodes/min)")
    print(
        f"ratio service/pytest {s / p:.2f} (target <= 1.15: {'MET' if s / p <= 1.15 else 'MISSED'})"
    )


if __name__ == "__main__":
    main()
