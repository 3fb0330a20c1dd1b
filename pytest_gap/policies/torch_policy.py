"""A torch module served as a policy (`gap policy serve torch --checkpoint FILE`, or handed to
`pytest_gap.evaluate`): batched inference over the native `gap` observation.

The module is the user's code. Its contract:

- `module.batch(observations) -> dict of tensors`: a list of observations (`images`
  {agentview, wrist} upright uint8 (H, W, 3), `state` 8-D, `prompt`) as the inputs of one
  forward pass; without it, `default_batch` (images as float (B, 3, H, W) in [0, 1], `state`
  (B, 8), `prompt` a list of strings);
- `module(batch) -> tensor (B, chunk, 7)`: each observation's action chunk.

`TorchPolicy.infer_batch` runs one forward pass for all the observations a batching server
collected (`gap policy serve --max-batch-size`), under `torch.inference_mode`, on `device`.

A checkpoint (`save_checkpoint`) is one file: the module's class as an import string, its
constructor's keyword arguments, its weights, and what the training loop wants recorded. It is
read with `torch.load(weights_only=True)` (tensors and plain data only, no pickled code) and the
class named in it is imported: a checkpoint is the operator's own file, opened by the operator's
`gap policy serve`, never named by a submitted config (whose policies are urls). torch is an
extra (`pip install -e ".[torch]"`, pinned): nothing outside this module imports it.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pytest_gap.errors import GapError, one_line

CHECKPOINT_FORMAT = "pytest-gap-torch/1"
CHECKPOINT_KEYS = ("format", "module", "kwargs", "state_dict", "meta")
TORCH_EXTRA = 'pip install -e ".[torch]" (torch==2.13.0)'


def _torch():
    try:
        import torch
    except ImportError:
        raise GapError(f"torch is not installed here: {TORCH_EXTRA}") from None
    return torch


def set_threads(n: int) -> None:
    """The CPU threads torch's inference uses (on a small machine, leave cores to the sim)."""
    _torch().set_num_threads(n)


def default_batch(observations: Sequence[dict]) -> dict[str, Any]:
    """The native observations as tensors: each camera (B, 3, H, W) float in [0, 1], `state`
    (B, 8) float, `prompt` the list of strings."""
    torch = _torch()
    batch: dict[str, Any] = {}
    for camera in observations[0].get("images", {}):
        stacked = np.stack([np.asarray(o["images"][camera], np.uint8) for o in observations])
        batch[camera] = torch.from_numpy(stacked).permute(0, 3, 1, 2).float().div_(255.0)
    states = np.stack([np.asarray(o["state"], np.float32).reshape(-1) for o in observations])
    batch["state"] = torch.from_numpy(states)
    batch["prompt"] = [str(o.get("prompt", "")) for o in observations]
    return batch


class TorchPolicy:
    """`module` as a policy (the module doc); `metadata` is what the server announces (and the
    records' policy_digest hashes)."""

    def __init__(self, module, *, device: str = "cpu", metadata: dict | None = None):
        torch = _torch()
        self.device = torch.device(device)
        self.module = module.to(self.device).eval()
        self.metadata = dict(metadata or {})

    def _to_device(self, value):
        return value.to(self.device) if hasattr(value, "to") else value

    def infer_batch(self, observations: Sequence[dict]) -> list[dict]:
        torch = _torch()
        make = getattr(self.module, "batch", None)
        batch = make(list(observations)) if callable(make) else default_batch(observations)
        with torch.inference_mode():
            out = self.module({k: self._to_device(v) for k, v in batch.items()})
        chunks = out.detach().float().cpu().numpy()
        if chunks.ndim != 3 or chunks.shape[0] != len(observations) or chunks.shape[2] != 7:
            raise GapError(
                f"{type(self.module).__name__} returned actions of shape {tuple(chunks.shape)} "
                f"for {len(observations)} observations: expected (batch, chunk, 7)"
            )
        return [{"actions": chunk} for chunk in chunks]

    def infer(self, obs: dict) -> dict:
        return self.infer_batch([obs])[0]


def file_digest(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def save_checkpoint(
    path: str | Path, module, *, factory: str, kwargs: dict | None = None, meta: dict | None = None
) -> str:
    """Write `module`'s checkpoint (the module doc) to `path`; `factory` is its class as
    `module:Class`, `kwargs` what that class is built with. Returns the file's sha256."""
    torch = _torch()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu() for k, v in module.state_dict().items()}
    checkpoint = {
        "format": CHECKPOINT_FORMAT,
        "module": factory,
        "kwargs": dict(kwargs or {}),
        "state_dict": state,
        "meta": dict(meta or {}),
    }
    torch.save(checkpoint, path)
    return file_digest(path)


def load_checkpoint(path: str | Path, *, device: str = "cpu") -> TorchPolicy:
    """The policy a checkpoint file holds; GapError (one line, naming the file) for a file that
    is not one, a class that cannot be imported or weights that do not fit it."""
    torch = _torch()
    path = Path(path)
    if not path.is_file():
        raise GapError(f"--checkpoint {path}: no such file")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many kinds for a file that is not its own
        raise GapError(f"--checkpoint {path}: not a torch checkpoint ({one_line(exc)})") from None
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise GapError(
            f"--checkpoint {path}: not a {CHECKPOINT_FORMAT} checkpoint; write one with "
            "pytest_gap.policies.torch_policy.save_checkpoint"
        )
    factory = str(checkpoint["module"])
    module_name, _, attr = factory.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise GapError(
            f"--checkpoint {path}: cannot import its module {factory} ({one_line(exc)})"
        ) from None
    module = cls(**checkpoint["kwargs"])
    try:
        module.load_state_dict(checkpoint["state_dict"])
    except RuntimeError as exc:
        raise GapError(
            f"--checkpoint {path}: its weights do not fit {factory} ({one_line(exc)})"
        ) from None
    metadata = {
        "policy": factory,
        "checkpoint": file_digest(path),
        **{k: v for k, v in checkpoint["meta"].items() if isinstance(v, str | int | float)},
    }
    return TorchPolicy(module, device=device, metadata=metadata)
