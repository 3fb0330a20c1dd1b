"""Compiled scenes on disk: the MuJoCo binary model (MJB) of each scene XML robosuite builds.

Compiling a LIBERO scene from its XML takes 3-4 s on a CPU (it decodes about 150 MB of PNG
textures and a million mesh vertices); loading the same scene's MJB takes about 0.4 s. Every
xdist worker, every `gap benchmark` and every test session builds its scenes afresh, so the
compiled model is kept on disk, keyed by everything the compiler reads: the XML text, the
size and modification time of each file it names, and the MuJoCo version. An MJB is MuJoCo's
own dump of the compiled `mjModel`, so a loaded scene is the compiled one, bit for bit
(tests/test_scene_cache.py checks physics and pixels).

Where: `$GAP_SCENE_CACHE` (a directory; `off` turns the cache off), else
`$XDG_CACHE_HOME/pytest-gap/scenes` (`~/.cache/...`). A LIBERO scene takes about 250 MB, so
the directory is held under `$GAP_SCENE_CACHE_MB` (default 4096) by removing the least
recently used scenes. Entries are written to a temporary name and renamed, so concurrent
workers never read half a file; one that fails to load is removed and the scene compiled.
A cache that cannot be written (read-only, full disk) costs nothing but the compile.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pytest_gap.errors import SimInputError

log = logging.getLogger(__name__)

DEFAULT_MAX_MB = 4096
_OFF = {"off", "0", "false", "no", "disable", "disabled"}
# Attributes whose values are files (or folders of them) the MJCF compiler reads.
_FILE_ATTRS = re.compile(r'\b(?:file|meshdir|texturedir|assetdir)="([^"]+)"')


class SceneCache:
    """MJB files of compiled scenes under `root`, at most `max_bytes` in all."""

    def __init__(self, root: Path, max_bytes: int):
        self.root = Path(root)
        self.max_bytes = max_bytes

    def key(self, xml: str) -> str:
        import mujoco

        digest = hashlib.sha256()
        digest.update(f"mujoco {mujoco.__version__}\n".encode())
        digest.update(xml.encode())
        for name in sorted(set(_FILE_ATTRS.findall(xml))):
            try:
                st = os.stat(name)
                digest.update(f"\n{name} {st.st_size} {st.st_mtime_ns}".encode())
            except OSError:
                digest.update(f"\n{name} -".encode())
        return digest.hexdigest()

    def path(self, xml: str) -> Path:
        return self.root / f"{self.key(xml)}.mjb"

    def model(self, xml: str):
        """The compiled model of `xml`: from the cache when it holds it, else compiled (and
        then stored)."""
        import mujoco

        path = self.path(xml)
        if path.is_file():
            try:
                model = _load_quietly(path)
            except Exception as exc:  # a damaged entry: drop it, compile as if absent
                log.warning("scene cache: %s does not load (%s); compiling", path, exc)
                path.unlink(missing_ok=True)
            else:
                with contextlib.suppress(OSError):
                    os.utime(path)  # recency, for eviction
                return model
        model = mujoco.MjModel.from_xml_string(xml)
        self._store(model, path)
        return model

    def _store(self, model, path: Path) -> None:
        import mujoco

        tmp = None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".", suffix=".mjb.part")
            os.close(fd)
            mujoco.mj_saveModel(model, tmp, None)
            os.replace(tmp, path)
            tmp = None
            self._evict(keep=path)
        except OSError as exc:
            log.info("scene cache: not stored in %s (%s)", self.root, exc)
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def _evict(self, keep: Path) -> None:
        """Remove the least recently used scenes until the cache fits `max_bytes` (the one just
        stored stays, even alone over the bound)."""
        entries = []
        for entry in self.root.glob("*.mjb"):
            with contextlib.suppress(OSError):
                st = entry.stat()
                entries.append((st.st_mtime, st.st_size, entry))
        total = sum(size for _, size, _ in entries)
        for _, size, entry in sorted(entries, key=lambda e: e[0]):
            if total <= self.max_bytes:
                break
            if entry == keep:
                continue
            with contextlib.suppress(OSError):
                entry.unlink()
                total -= size


def _load_quietly(path: Path):
    """MuJoCo's loader reports a damaged MJB as a warning written to MUJOCO_LOG.TXT in the
    working directory, then raises; the exception is enough, so the warning is caught here."""
    import mujoco

    warnings: list[str] = []
    previous = mujoco.get_mju_user_warning()
    mujoco.set_mju_user_warning(warnings.append)
    try:
        return mujoco.MjModel.from_binary_path(str(path))
    finally:
        mujoco.set_mju_user_warning(previous)


def scene_cache_from_env(environ: os._Environ | dict | None = None) -> SceneCache | None:
    """The cache `GAP_SCENE_CACHE` / `GAP_SCENE_CACHE_MB` describe; None when turned off."""
    environ = os.environ if environ is None else environ
    where = environ.get("GAP_SCENE_CACHE", "").strip()
    if where.lower() in _OFF:
        return None
    if not where:
        base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        where = str(Path(base) / "pytest-gap" / "scenes")
    raw_mb = environ.get("GAP_SCENE_CACHE_MB", "").strip() or str(DEFAULT_MAX_MB)
    try:
        max_mb = float(raw_mb)
    except ValueError:
        raise SimInputError(
            f"GAP_SCENE_CACHE_MB={raw_mb!r} is not a number of megabytes; "
            f"unset it for the default {DEFAULT_MAX_MB} or set e.g. 8192"
        ) from None
    return SceneCache(Path(where).expanduser(), int(max_mb * 2**20))


@contextlib.contextmanager
def compiled_scenes(cache: SceneCache | None) -> Iterator[None]:
    """While open, robosuite's `MjSim.from_xml_string` (how every robosuite env compiles its
    scene) takes its model from `cache`. Only the env under construction sees it: robosuite
    has no hook for where a model comes from, so the class method is swapped and restored."""
    if cache is None:
        yield
        return
    from robosuite.utils.binding_utils import MjSim

    original = MjSim.__dict__["from_xml_string"]
    MjSim.from_xml_string = classmethod(lambda cls, xml: cls(cache.model(xml)))
    try:
        yield
    finally:
        MjSim.from_xml_string = original
