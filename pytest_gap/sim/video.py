"""MP4 recording of one episode through imageio-ffmpeg, written as frames arrive."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np

from pytest_gap.errors import VideoError


class VideoWriter:
    def __init__(self, path: str | Path, fps: int = 20):
        import imageio.v2 as imageio

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.frames = 0
        self._writer = imageio.get_writer(
            str(self.path), fps=fps, codec="libx264", quality=8, macro_block_size=1
        )

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
