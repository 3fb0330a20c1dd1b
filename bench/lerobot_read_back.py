r"""Read a LeRobot v3.0 dataset back with LeRobot's own LeRobotDataset, offline.

Usage (NOT the project venv):
    /tmp/lrenv/bin/python bench/lerobot_read_back.py ROOT \
        [--repo-id local/ref] [--video-backend torchcodec]

Opens ROOT with LeRobotDataset(repo_id, root=ROOT, video_backend=...), prints
num_episodes, num_frames, fps, features, each episode's length and tasks, decodes
every frame of every camera (dataset[i] for all i), checks shapes, prints the
per-camera mean pixel value, and exits 1 with a one-line "FAIL: ..." on any error.

Video backend: "torchcodec" (the default here) works.  "pyav" does not with
torchvision >= 0.28: LeRobot's pyav path calls torchvision.io.VideoReader,
which torchvision 0.28 removed (AttributeError).

The environment: `bash bench/lerobot_env.sh [/tmp/lrenv]` (2-2.5 min, 1.5 GB; lerobot 0.4.4
with --no-deps beside the CPU torch 2.13.0 of this disk, torchcodec 0.13 over Debian's
FFmpeg 5.1). The project's own venv never gets lerobot: it pins another torch.

A run's dataset: `gap dataset RUN --out DIR` (or trials.dataset, in RUN/dataset), then
    /tmp/lrenv/bin/python bench/lerobot_read_back.py DIR
"""

import argparse
import os
import sys

for _k, _v in {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
}.items():
    os.environ.setdefault(_k, _v)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", help="dataset root (the folder holding meta/, data/, videos/)")
    ap.add_argument("--repo-id", default="local/ref")
    ap.add_argument("--video-backend", default="torchcodec", help="torchcodec (works) or pyav")
    args = ap.parse_args()

    from pathlib import Path

    if not (Path(args.root) / "meta" / "info.json").is_file():
        raise FileNotFoundError(f"{args.root}/meta/info.json not found (not a LeRobot v3 root)")

    import lerobot
    import torch
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    try:
        lr_version = lerobot.__version__
    except AttributeError:
        from importlib.metadata import version

        lr_version = version("lerobot")
    print(f"lerobot {lr_version}, torch {torch.__version__}, video_backend {args.video_backend}")

    ds = LeRobotDataset(args.repo_id, root=args.root, video_backend=args.video_backend)
    meta = ds.meta
    print(f"codebase_version: {meta.info['codebase_version']}  robot_type: {meta.robot_type}")
    print(f"num_episodes: {ds.num_episodes}  num_frames: {ds.num_frames}  fps: {ds.fps}")
    print("features:")
    for key, ft in ds.features.items():
        print(f"  {key}: dtype={ft['dtype']} shape={tuple(ft['shape'])} names={ft.get('names')}")

    eps = meta.episodes
    lengths = [int(x) for x in eps["length"]]
    for i in range(len(eps)):
        ep, tasks = int(eps["episode_index"][i]), list(eps["tasks"][i])
        print(f"  episode {ep}: length={lengths[i]} tasks={tasks}")
    if sum(lengths) != ds.num_frames:
        raise RuntimeError(f"episode lengths sum to {sum(lengths)}, num_frames is {ds.num_frames}")

    cams = list(meta.video_keys) + list(meta.image_keys)
    sums = {c: 0.0 for c in cams}
    for i in range(len(ds)):
        item = ds[i]
        for c in cams:
            h, w, ch = ds.features[c]["shape"]
            x = item[c]
            if tuple(x.shape) != (ch, h, w):
                raise RuntimeError(f"frame {i} {c}: shape {tuple(x.shape)}, expected {(ch, h, w)}")
            if not torch.isfinite(x).all():
                raise RuntimeError(f"frame {i} {c}: non-finite pixels")
            sums[c] += float(x.float().mean())
        for key, ft in ds.features.items():
            if ft["dtype"] not in ("float32", "float64") or key not in item:
                continue
            got, want = tuple(item[key].shape), tuple(ft["shape"])
            if got != want and not (want == (1,) and got == ()):
                raise RuntimeError(f"frame {i} {key}: shape {got}, expected {want}")
    print(f"decoded {len(ds)} frames x {len(cams)} cameras")
    for c in cams:
        # items are float in [0, 1] (C, H, W); also shown on the 0-255 scale
        m = sums[c] / max(len(ds), 1)
        print(f"  mean pixel {c}: {m:.4f} (x255 = {m * 255:.2f})")
    print("OK")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException as e:  # one-line failure by design
        msg = " ".join(str(e).split())[:300]
        print(f"FAIL: {type(e).__name__}: {msg}", file=sys.stderr)
        sys.exit(1)
