"""A small visuomotor policy for LIBERO: both cameras at a reduced size, the proprio state and
the task's words in, a chunk of actions out. Served by `gap policy serve torch --checkpoint
FILE` (pytest_gap/policies/torch_policy.py); its inputs are the native `gap` observation.

    images  agentview, wrist: each resized to `image_size`, three convolutions to a quarter of
            the image, modulated by the task (FiLM), then 32 keypoint maps: each map's
            expected (x, y) under a spatial softmax and its peak, 96 numbers per camera
    state   eef xyz and the two finger joints (STATE_DIMS of the 8-D proprio), standardised
            with the training set's mean and std (buffers)
    prompt  its words hashed into `vocab` buckets, an EmbeddingBag (no vocabulary to ship)
    out     an MLP to `chunk` x 7 actions, un-standardised with the training set's statistics

Keypoints rather than pooled features: the demonstrator descends only within 1.2 cm of the
object, so what the network must read is *where* things are, which global pooling discards.
About 0.2 M parameters: a forward pass of one observation is a few milliseconds on a CPU core,
which is what makes batching across episodes measurable (bench/policy_throughput.py).
"""

from __future__ import annotations

import zlib

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

CAMERAS = ("agentview", "wrist")
# The proprio dims the network reads: eef xyz and the two finger joints. The hand's orientation
# (dims 3-5) is left out: the demonstrator never turns it, so in its episodes it only drifts by
# hundredths of a radian, and standardised by that tiny spread it became a shortcut the network
# leaned on (the held-out episodes drifted further and the actions diverged with it).
STATE_DIMS = (0, 1, 2, 6, 7)


def word_buckets(prompt: str, vocab: int) -> list[int]:
    """A prompt's words as stable bucket ids (crc32: the same in every process, unlike hash)."""
    words = prompt.lower().replace(",", " ").replace(".", " ").split()
    return [zlib.crc32(w.encode()) % vocab for w in words] or [0]


class SpatialSoftmax(nn.Module):
    """Each feature map as the expected (x, y) of its softmax: where it fired, in [-1, 1]."""

    def forward(self, maps: torch.Tensor) -> torch.Tensor:
        n, k, h, w = maps.shape
        weights = maps.flatten(2).softmax(dim=-1).view(n, k, h, w)
        ys = torch.linspace(-1.0, 1.0, h, device=maps.device)
        xs = torch.linspace(-1.0, 1.0, w, device=maps.device)
        x = (weights.sum(2) * xs).sum(-1)
        y = (weights.sum(3) * ys).sum(-1)
        return torch.cat([x, y], dim=1)


class Encoder(nn.Module):
    """A camera as keypoints: two strided convolutions to a quarter of the image, the task's
    FiLM (so the maps look for this task's object), then `keypoints` maps to spatial softmax,
    beside each map's peak (whether what it looks for is in view)."""

    def __init__(self, width: int = 32, keypoints: int = 32, task: int = 32):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 5, stride=2, padding=2),
            nn.GELU(),
            nn.Conv2d(width, width, 3, stride=2, padding=1),
            nn.GELU(),
            nn.Conv2d(width, width, 3, padding=1),
        )
        self.film = nn.Linear(task, 2 * width)
        self.maps = nn.Conv2d(width, keypoints, 3, padding=1)
        self.softmax = SpatialSoftmax()
        self.out = 3 * keypoints

    def forward(self, image: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
        scale, shift = self.film(task)[:, :, None, None].chunk(2, dim=1)
        features = F.gelu(self.stem(image) * (1 + scale) + shift)
        maps = self.maps(features)
        return torch.cat([self.softmax(maps), maps.amax(dim=(2, 3))], dim=1)


class VisuomotorPolicy(nn.Module):
    def __init__(self, image_size: int = 96, chunk: int = 10, vocab: int = 512, hidden: int = 256):
        super().__init__()
        self.image_size, self.chunk, self.vocab = image_size, chunk, vocab
        self.encoders = nn.ModuleDict({c: Encoder() for c in CAMERAS})
        self.words = nn.EmbeddingBag(vocab, 32, mode="mean")
        features = sum(e.out for e in self.encoders.values())
        self.head = nn.Sequential(
            nn.Linear(features + len(STATE_DIMS) + 32, hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, chunk * 7),
        )
        for name, size in (("state", len(STATE_DIMS)), ("action", 7)):
            self.register_buffer(f"{name}_mean", torch.zeros(size))
            self.register_buffer(f"{name}_std", torch.ones(size))

    def batch(self, observations: list[dict]) -> dict[str, torch.Tensor]:
        """The native observations as this model's inputs (TorchPolicy calls it)."""
        out = {}
        for camera in CAMERAS:
            stacked = np.stack([np.asarray(o["images"][camera], np.uint8) for o in observations])
            images = torch.from_numpy(stacked).permute(0, 3, 1, 2).float().div_(255.0)
            if images.shape[-1] != self.image_size:
                images = F.interpolate(images, size=(self.image_size, self.image_size), mode="area")
            out[camera] = images
        out["state"] = torch.from_numpy(
            np.stack([np.asarray(o["state"], np.float32).reshape(8) for o in observations])
        )
        ids = [word_buckets(str(o.get("prompt", "")), self.vocab) for o in observations]
        out["words"] = torch.tensor([i for row in ids for i in row], dtype=torch.long)
        out["word_offsets"] = torch.tensor(np.cumsum([0] + [len(r) for r in ids[:-1]]))
        return out

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        words = self.words(batch["words"], batch["word_offsets"])
        features = [self.encoders[c](batch[c], words) for c in CAMERAS]
        state = (batch["state"][:, list(STATE_DIMS)] - self.state_mean) / self.state_std
        raw = self.head(torch.cat([*features, state, words], dim=1))
        actions = raw.view(-1, self.chunk, 7)
        return actions * self.action_std + self.action_mean
