"""A LeRobot dataset's videos (outputs/lerobot.py): reading a trial's lossless recording and
encoding each camera's episodes back to back into the dataset's files.

H.264 in yuv420p with a key frame every VIDEO_GOP frames (LeRobot encodes its own with a GOP
of 2, for random access), at crf VIDEO_CRF; a new file once one passes VIDEO_FILE_MB.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
CHUNKS_SIZE = 1000  # files per chunk directory
VIDEO_FILE_MB = 200  # a video file holds episodes until it is this big
VIDEO_CRF = 18  # H.264's quality scale: 18 is near transparent
VIDEO_GOP = 2


def video_key(camera: str) -> str:
    return f"observation.images.{camera}"


def read_video(path: Path, size: int) -> np.ndarray:
    """Every frame of a `size` px square video, (frames, size, size, 3) uint8, through
    imageio-ffmpeg's ffmpeg in one call (its frame generator leaves ffmpeg's pipes open when
    ffmpeg exits first)."""
    import imageio_ffmpeg
    import numpy as np

    command = [imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-i", str(path)]
    command += ["-f", "rawvideo", "-pix_fmt", "rgb24", "-"]
    done = subprocess.run(command, capture_output=True, check=False)
    if done.returncode != 0:
        problem = done.stderr.decode(errors="replace").strip().splitlines()
        raise ValueError(
            f"ffmpeg could not read {path}: {problem[-1] if problem else done.returncode}"
        )
    frame = size * size * 3
    if len(done.stdout) % frame:
        raise ValueError(f"{path}: its frames are not {size}x{size}")
    return np.frombuffer(done.stdout, np.uint8).reshape(-1, size, size, 3)


def read_first_frames(path: Path, size: int, n: int) -> np.ndarray:
    """The first `n` frames of a recorded (lossless) trial video."""
    frames = read_video(path, size)
    if len(frames) < n:
        raise ValueError(f"{path}: {len(frames)} frames, {n} needed")
    return frames[:n]


class VideoFiles:
    """One camera's video files: episodes appended back to back, a new file once the current
    one passes VIDEO_FILE_MB."""

    def __init__(self, root: Path, camera: str, fps: int, size: int):
        self.root, self.key, self.fps, self.size = root, video_key(camera), fps, size
        self.chunk = self.file = 0
        self.frames_in_file = 0
        self._writer = None
        self._path: Path | None = None

    def append(self, frames) -> tuple[int, int, float, float]:
        """Encode one episode's frames; its (chunk_index, file_index, from, to timestamp)."""
        import imageio_ffmpeg

        full = self._path is not None and self._path.is_file()
        if full and self._path.stat().st_size > VIDEO_FILE_MB * 2**20:
            self.close()
            self.file += 1
            if self.file >= CHUNKS_SIZE:
                self.chunk, self.file = self.chunk + 1, 0
        if self._writer is None:
            self._path = self.root / VIDEO_PATH.format(
                video_key=self.key, chunk_index=self.chunk, file_index=self.file
            )
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = imageio_ffmpeg.write_frames(
                str(self._path),
                (self.size, self.size),
                fps=self.fps,
                codec="libx264",
                pix_fmt_out="yuv420p",
                quality=None,
                macro_block_size=1,
                output_params=["-crf", str(VIDEO_CRF), "-g", str(VIDEO_GOP), "-preset", "fast"],
            )
            self._writer.send(None)
            self.frames_in_file = 0
        start = self.frames_in_file
        for frame in frames:
            self._writer.send(frame)
        self.frames_in_file += len(frames)
        return self.chunk, self.file, start / self.fps, self.frames_in_file / self.fps

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
