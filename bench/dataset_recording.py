"""What recording an episode for a dataset (trials.dataset) costs, and what writing the dataset
costs: the same steps with and without the recording, side by side in one process, on real
LIBERO.

    python bench/dataset_recording.py [--suite libero_object] [--task 0] [--steps 100]
                                      [--rounds 3] [--sizes 96,128] [--every 1,5]

Each round runs the same `--steps` actions from one seed without a recording and then with
each (size, every) asked for, alternating round by round (the machine's noise falls on all
alike). Prints each one's median time per control step, its ratio to the step without, and
what `gap dataset` then takes per episode (decode the lossless recording, encode H.264, stats).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from pytest_gap.outputs.lerobot_video import VideoFiles, read_first_frames
from pytest_gap.sim.backend import DatasetFrames, EnvOptions
from pytest_gap.sim.libero import make_env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default="libero_object")
    parser.add_argument("--task", type=int, default=0)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="96,128")
    parser.add_argument("--every", default="1,5")
    args = parser.parse_args()
    shapes = [(int(s), int(e)) for s in args.sizes.split(",") for e in args.every.split(",")]
    actions = np.random.default_rng(0).uniform(-0.3, 0.3, (args.steps, 7))
    per_step: dict[tuple[int, int] | None, list[float]] = {None: [], **{s: [] for s in shapes}}
    scratch = Path(tempfile.mkdtemp(prefix="gap-dataset-bench-"))
    with make_env(args.suite, args.task, EnvOptions(max_steps=args.steps)) as env:
        for _ in range(args.rounds):
            for shape in per_step:
                where = scratch / (f"{shape[0]}_{shape[1]}" if shape else "none")
                dataset = DatasetFrames(dir=where, size=shape[0], every=shape[1]) if shape else None
                env.reset(0, dataset=dataset)
                start = time.perf_counter()
                for action in actions:
                    env.step(action)
                env.finish_video()  # closes the recording: its cost is the trial's
                per_step[shape].append((time.perf_counter() - start) / args.steps)
    base = statistics.median(per_step[None])
    print(f"{args.suite} task {args.task}, {args.steps} steps, {args.rounds} rounds")
    print(f"  no recording           {base * 1e3:7.1f} ms/step")
    for shape in shapes:
        median = statistics.median(per_step[shape])
        print(
            f"  {shape[0]:3d} px every {shape[1]:2d} step  {median * 1e3:7.1f} ms/step  "
            f"x{median / base:.2f}"
        )
    for size, every in shapes:  # writing one episode of each into a dataset's video files
        where = scratch / f"{size}_{every}"
        n = -(-args.steps // every)
        start = time.perf_counter()
        out = scratch / f"out_{size}_{every}"
        for camera in ("agentview", "wrist"):
            frames = read_first_frames(where / f"dataset_{camera}.mp4", size, n)
            files = VideoFiles(out, camera, 20 // every, size)
            files.append(frames)
            files.close()
        took = time.perf_counter() - start
        print(f"  writing {size} px every {every}: {took:.2f} s an episode ({n} frames)")


if __name__ == "__main__":
    main()
