"""Behaviour cloning of examples/policies/visuomotor.py on a dataset the harness recorded.

    python -m examples.policies.train DATASET --out DIR [--epochs 30] [--save 5,30]
        [--chunk 10] [--image-size 96] [--batch-size 64] [--lr 1e-3] [--seed 0] [--threads 2]
        [--labels DIR ...] [--init CHECKPOINT]

DATASET is a LeRobot v3 dataset written by pytest-gap (`trials.dataset`, `gap dataset`): its
frames, the state, and the actions taken from each frame (`action.chunk` when it was recorded
at every N-th step). Each sample is one frame: both cameras resized to `--image-size`, the
state and the task, and as target the next `--chunk` actions the demonstrator took (masked
past the episode's end); `--labels DIR` (repeatable) adds a DAgger round's queries labelled by
the oracle (examples/policies/dagger.py), and `--init CHECKPOINT` goes on from a checkpoint's
weights and standardisation (a DAgger round's, from the checkpoint that acted). The loss is L1
on standardised actions, the learning rate one cycle (5% warm-up, then cosine down); the images
get a random shift of up to 4 px. Seeds fix the initial weights, the order and the shifts.

Writes DIR/<epoch>.pt at each epoch of `--save` (pytest_gap.policies.torch_policy
save_checkpoint: serve one with `gap policy serve torch --checkpoint DIR/30.pt`, run from the
repository root or with it on PYTHONPATH) and DIR/train_log.jsonl, one line per epoch (loss,
seconds, samples).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from torch.nn import functional as F

from examples.policies.visuomotor import CAMERAS, STATE_DIMS, VisuomotorPolicy, word_buckets
from pytest_gap.outputs.lerobot_video import read_video
from pytest_gap.policies.torch_policy import load_checkpoint, save_checkpoint

FACTORY = "examples.policies.visuomotor:VisuomotorPolicy"
SHIFT = 4  # px of random shift (pad and crop) per image


def load_samples(root: Path, chunk: int, image_size: int) -> dict[str, np.ndarray | list]:
    """Every frame of the dataset as a sample (module doc), images already at `image_size`."""
    info = json.loads((root / "meta/info.json").read_text())
    size = info["features"][f"observation.images.{CAMERAS[0]}"]["shape"][0]
    data = pq.read_table(root / "data/chunk-000/file-000.parquet").to_pydict()
    episodes = pq.read_table(next((root / "meta/episodes").rglob("*.parquet"))).to_pylist()
    tasks = {e["episode_index"]: e["tasks"][0] for e in episodes}
    images = {}
    for camera in CAMERAS:
        key = f"observation.images.{camera}"
        frames = read_video(
            root / info["video_path"].format(video_key=key, chunk_index=0, file_index=0), size
        )
        tensor = torch.from_numpy(frames.copy()).permute(0, 3, 1, 2).float().div_(255.0)
        if size != image_size:
            tensor = F.interpolate(tensor, size=(image_size, image_size), mode="area")
        images[camera] = (tensor * 255).round().to(torch.uint8)
    per_row = np.asarray(data["action.chunk"] if "action.chunk" in data else data["action"])
    per_row = per_row.reshape(len(data["index"]), -1, 7)
    pads = np.asarray(data.get("action.chunk_is_pad", np.zeros(per_row.shape[:2], bool)))
    targets = np.zeros((len(per_row), chunk, 7), np.float32)
    mask = np.zeros((len(per_row), chunk), bool)
    for e in episodes:
        start, end = e["dataset_from_index"], e["dataset_to_index"]
        actions = per_row[start:end][~pads[start:end]].reshape(-1, 7)  # the episode's steps
        stride = per_row.shape[1]
        for row in range(start, end):
            first = (row - start) * stride
            take = actions[first : first + chunk]
            targets[row, : len(take)] = take
            targets[row, len(take) :] = take[-1]
            mask[row, : len(take)] = True
    return {
        "images": images,
        "state": np.asarray(data["observation.state"], np.float32),
        "prompt": [tasks[i] for i in data["episode_index"]],
        "targets": targets,
        "mask": mask,
    }


def load_labels(folders: list[Path], chunk: int, image_size: int) -> dict:
    """DAgger labels (examples/policies/dagger.py): each query's images, state and prompt with
    the oracle's chunk as target (masked past its length)."""
    files = sorted(f for folder in folders for f in folder.glob("*.npz"))
    images = {c: [] for c in CAMERAS}
    state, prompt = [], []
    targets = np.zeros((len(files), chunk, 7), np.float32)
    mask = np.zeros((len(files), chunk), bool)
    for i, path in enumerate(files):
        with np.load(path) as label:
            for camera in CAMERAS:
                frame = torch.from_numpy(label[camera]).permute(2, 0, 1)
                if frame.shape[-1] != image_size:
                    frame = F.interpolate(frame[None].float(), size=(image_size,) * 2, mode="area")
                    frame = frame[0].round().to(torch.uint8)
                images[camera].append(frame)
            state.append(label["state"])
            prompt.append(str(label["prompt"]))
            actions = label["actions"][:chunk]
        targets[i, : len(actions)] = actions
        targets[i, len(actions) :] = actions[-1]
        mask[i, : len(actions)] = True
    return {
        "images": {c: torch.stack(v) for c, v in images.items()},
        "state": np.asarray(state, np.float32).reshape(-1, 8),
        "prompt": prompt,
        "targets": targets,
        "mask": mask,
    }


def merged(a: dict, b: dict) -> dict:
    return {
        "images": {c: torch.cat([a["images"][c], b["images"][c]]) for c in CAMERAS},
        "state": np.concatenate([a["state"], b["state"]]),
        "prompt": a["prompt"] + b["prompt"],
        "targets": np.concatenate([a["targets"], b["targets"]]),
        "mask": np.concatenate([a["mask"], b["mask"]]),
    }


def shifted(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Each image shifted by up to SHIFT px (edge padding, then a random crop)."""
    n, _, h, w = images.shape
    padded = F.pad(images, (SHIFT, SHIFT, SHIFT, SHIFT), mode="replicate")
    dx = torch.randint(0, 2 * SHIFT + 1, (n,), generator=generator)
    dy = torch.randint(0, 2 * SHIFT + 1, (n,), generator=generator)
    return torch.stack([padded[i, :, dy[i] : dy[i] + h, dx[i] : dx[i] + w] for i in range(n)])


def standardise(model: VisuomotorPolicy, state: torch.Tensor, actions: torch.Tensor) -> None:
    with torch.no_grad():
        read = state[:, list(STATE_DIMS)]
        model.state_mean.copy_(read.mean(0))
        # a floor of 1 cm (and 1 cm of finger travel): no dim is amplified past what it means
        model.state_std.copy_(read.std(0).clamp_min(0.01))
        model.action_mean.copy_(actions.mean(0))
        model.action_std.copy_(actions.std(0).clamp_min(1e-3))


def train(args: argparse.Namespace) -> list[dict]:
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(args.seed)
    samples = load_samples(args.dataset, args.chunk, args.image_size)
    if args.labels:
        samples = merged(samples, load_labels(args.labels, args.chunk, args.image_size))
    kwargs = {"image_size": args.image_size, "chunk": args.chunk}
    model = VisuomotorPolicy(**kwargs)
    print(json.dumps({"parameters": sum(p.numel() for p in model.parameters())}), flush=True)
    state = torch.from_numpy(samples["state"])
    targets = torch.from_numpy(samples["targets"])
    mask = torch.from_numpy(samples["mask"])
    if args.init:  # a DAgger round goes on from the checkpoint that acted: its statistics too
        model.load_state_dict(load_checkpoint(args.init).module.state_dict())
    else:
        standardise(model, state, targets[mask])

    words = [word_buckets(p, model.vocab) for p in samples["prompt"]]
    optimiser = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    steps = args.epochs * -(-len(state) // args.batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimiser, max_lr=args.lr, total_steps=steps, pct_start=0.05
    )
    save = {int(e) for e in args.save.split(",")}
    args.out.mkdir(parents=True, exist_ok=True)
    log, n = [], len(state)
    for epoch in range(1, args.epochs + 1):
        started, total, model = time.perf_counter(), 0.0, model.train()
        order = torch.randperm(n, generator=generator)
        for at in range(0, n, args.batch_size):
            rows = order[at : at + args.batch_size]
            batch = {
                c: shifted(samples["images"][c][rows].float().div_(255.0), generator)
                for c in CAMERAS
            }
            batch["state"] = state[rows]
            ids = [words[i] for i in rows.tolist()]
            batch["words"] = torch.tensor([i for row in ids for i in row])
            batch["word_offsets"] = torch.tensor(np.cumsum([0] + [len(r) for r in ids[:-1]]))
            predicted = model(batch)
            error = (predicted - targets[rows]).abs() / model.action_std
            loss = error[mask[rows]].mean()
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            schedule.step()
            total += loss.item() * len(rows)
        entry = {"epoch": epoch, "loss": total / n, "seconds": time.perf_counter() - started}
        entry["samples"] = n
        if epoch in save:
            entry["checkpoint"] = save_checkpoint(
                args.out / f"{epoch}.pt",
                model.eval(),
                factory=FACTORY,
                kwargs=kwargs,
                meta={"epoch": epoch, "seed": args.seed, "samples": n},
            )
        log.append(entry)
        with open(args.out / "train_log.jsonl", "a") as handle:
            handle.write(json.dumps(entry) + "\n")
        print(json.dumps(entry), flush=True)
    return log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dataset", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--save", default="5,30", help="epochs to write a checkpoint at")
    parser.add_argument("--chunk", type=int, default=10)
    parser.add_argument("--image-size", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--init", type=Path, help="a checkpoint to go on from (its weights and statistics)"
    )
    parser.add_argument(
        "--labels",
        type=Path,
        action="append",
        help="a DAgger round's labels (examples/policies/dagger.py), added to the dataset",
    )
    train(parser.parse_args())


if __name__ == "__main__":
    main()
