"""The sinks of an episode's frames: an MP4 through imageio-ffmpeg (`VideoWriter`), written as
frames arrive, and a WebP sprite strip through Pillow (`StripWriter`), written at the end.

The env renders each frame once and hands it to every sink that wants it (sim/libero.py
`_observe_and_record`); a sink records, it does not render.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import numpy as np

from pytest_gap.errors import VideoError


class VideoWriter:
    """`lossless`: exact RGB (libx264rgb at qp 0), for frames that are encoded again later
    (sim/dataset_frames.py); else H.264 in yuv420p at imageio's quality 8, for people."""

    def __init__(self, path: str | Path, fps: int = 20, *, lossless: bool = False):
        import imageio.v2 as imageio

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.frames = 0
        encoding = (
            {
                "codec": "libx264rgb",
                "pixelformat": "rgb24",
                "quality": None,
                "ffmpeg_params": ["-qp", "0", "-preset", "ultrafast"],
            }
            if lossless
            else {"codec": "libx264", "quality": 8}
        )
        self._writer = imageio.get_writer(str(self.path), fps=fps, macro_block_size=1, **encoding)

    def append(self, frame: np.ndarray) -> None:
        frame = np.asarray(frame, dtype=np.uint8)
        # H.264 in yuv420p needs even sizes; repeat the last row/column rather than rescale.
        pad = ((0, frame.shape[0] % 2), (0, frame.shape[1] % 2), (0, 0))
        if any(p[1] for p in pad):
            frame = np.pad(frame, pad, mode="edge")
        self._writer.append_data(np.ascontiguousarray(frame))
        self.frames += 1

    def close(self) -> int:
        """Finish the file; return the number of frames written."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            if self.frames and (not self.path.is_file() or self.path.stat().st_size == 0):
                raise VideoError(
                    f"video {self.path}: ffmpeg wrote nothing for {self.frames} frames"
                )
        return self.frames


# A strip tile's height: a 256x256 agentview render halved. A 280-step episode at every 10th
# frame is 29 tiles, 3712 x 128 px, about 80 kB of WebP.
STRIP_HEIGHT = 128
# Lossy WebP quality (Pillow's 0-100 scale; 80 is libwebp's default): thumbnails to look at,
# not pixels to measure (the mp4 and the trace are for that).
STRIP_QUALITY = 80
WEBP_MAX_SIDE = 16383  # libwebp's limit on either side of an image


class StripWriter:
    """One episode's frames as a sprite strip: each frame is downscaled to `height` px as it
    arrives (only thumbnails are kept), and `close` writes them left to right into one lossy
    WebP at `path`. A strip wider than WebP allows (more than 127 tiles of 128x128) wraps onto
    further rows of the same tile size, left to right, top to bottom."""

    def __init__(self, path: str | Path, height: int = STRIP_HEIGHT, quality: int = STRIP_QUALITY):
        self.path = Path(path)
        self.height, self.quality = height, quality
        self.frames = 0
        self._tiles: list = []  # PIL images

    def append(self, frame: np.ndarray) -> None:
        from PIL import Image

        image = Image.fromarray(np.ascontiguousarray(frame, dtype=np.uint8))
        width = max(1, round(image.width * self.height / image.height))
        self._tiles.append(image.resize((width, self.height), Image.Resampling.LANCZOS))
        self.frames += 1

    def close(self) -> int:
        """Write the strip (nothing when no frame came); return the number of tiles in it."""
        tiles, self._tiles = self._tiles, []
        if not tiles:
            return self.frames
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            compose_strip(tiles).save(tmp, format="WEBP", quality=self.quality)
            os.replace(tmp, self.path)
        except (OSError, ValueError) as exc:
            tmp.unlink(missing_ok=True)
            raise VideoError(
                f"frame strip {self.path}: Pillow could not write it ({type(exc).__name__}: {exc})"
            ) from None
        return self.frames


def compose_strip(tiles: list):
    """Tiles of one size (PIL images), left to right in one image; rows of as many as fit in
    WebP's width limit when they do not all fit in one."""
    from PIL import Image

    width, height = tiles[0].size
    per_row = max(1, min(len(tiles), WEBP_MAX_SIDE // width))
    rows = -(-len(tiles) // per_row)
    sheet = Image.new("RGB", (per_row * width, rows * height))
    for i, tile in enumerate(tiles):
        sheet.paste(tile, ((i % per_row) * width, (i // per_row) * height))
    return sheet


def read_frames(path: str | Path) -> np.ndarray:
    """All frames of a video as (N, H, W, 3) uint8 (decoded by the bundled ffmpeg)."""
    import imageio_ffmpeg

    ffmpeg = imageio_ffmpeg.get_ffmpeg_exe()
    cmd = [ffmpeg, "-v", "info", "-i", str(path), "-f", "rawvideo", "-pix_fmt", "rgb24", "-"]
    proc = subprocess.run(cmd, capture_output=True, check=False)
    size = re.search(rb"Video: .*?, (\d{2,5})x(\d{2,5})", proc.stderr)
    if proc.returncode != 0 or size is None:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:]
        raise ValueError(f"cannot decode video {path}: {' '.join(tail)}")
    width, height = int(size.group(1)), int(size.group(2))
    return np.frombuffer(proc.stdout, np.uint8).reshape(-1, height, width, 3)
