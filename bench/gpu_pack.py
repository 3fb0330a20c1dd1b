"""Pack what bench/gpu_check.py needs on a lent GPU machine (Python 3.12, no network, no MuJoCo
or PyOpenGL installed, 64 MiB for everything that travels, this repository included) into one
git-ignored folder, carried with the run (`carry: ["gpu_carry"]`):

    gpu_carry/wheels/   cp312 wheels of this machine's MuJoCo and NumPy versions, PyOpenGL and
                        typing_extensions (MuJoCo imports it); MuJoCo's without `experimental/`
                        and the viewers (what an offscreen render never loads: 16 of its 27 MB)
    gpu_carry/scene.mjb.xz, scene.json   bench/gpu_scene.py's cut LIBERO scene
    gpu_carry/run.sh    unpacks the wheels and runs the check into $OUT

    python bench/gpu_pack.py [--out gpu_carry] [--limit-mib 60]

Exits 1 when the folder is over the limit. On the device: `bash gpu_carry/run.sh`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# Parts of the MuJoCo wheel an offscreen render never imports.
MUJOCO_LEFT_OUT = (
    "mujoco/experimental/",
    "mujoco/_simulate",
    "mujoco/viewer",
    "mujoco/_render_filament",
)
RUN_SH = """#!/usr/bin/env bash
# Unpack the carried wheels and run bench/gpu_check.py on the carried scene into $OUT.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
site="$(mktemp -d)"
for wheel in "$here"/wheels/*.whl; do python3 -m zipfile -e "$wheel" "$site"; done
cd "$here/.."
PYTHONPATH="$site:$PWD" MUJOCO_GL="${MUJOCO_GL:-egl}" \\
  python3 bench/gpu_check.py --scene "$here/scene.mjb.xz" --out "${OUT:-gpu_check_out}" "$@"
"""


def installed_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def download(wheels: Path, python: str = "3.12") -> list[Path]:
    """manylinux wheels for `python` of the versions installed here (an .mjb reads with its own
    MuJoCo version only)."""
    pins = [
        f"mujoco=={installed_version('mujoco')}",
        f"numpy=={installed_version('numpy')}",
        f"PyOpenGL=={installed_version('PyOpenGL')}",
        f"typing_extensions=={installed_version('typing_extensions')}",
    ]
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            python,
            "--implementation",
            "cp",
            *platforms,
            "-d",
            str(wheels),
            *pins,
        ],
        check=True,
    )
    return sorted(wheels.glob("*.whl"))


def slim(wheel: Path) -> None:
    """Rewrite a wheel without the members MUJOCO_LEFT_OUT names (unzipped, never installed by
    pip: its RECORD is not checked)."""
    with tempfile.NamedTemporaryFile(dir=wheel.parent, suffix=".whl", delete=False) as tmp:
        slimmed = Path(tmp.name)
    with (
        zipfile.ZipFile(wheel) as source,
        zipfile.ZipFile(slimmed, "w", zipfile.ZIP_DEFLATED) as out,
    ):
        for item in source.infolist():
            if not item.filename.startswith(MUJOCO_LEFT_OUT):
                out.writestr(item, source.read(item))
    slimmed.replace(wheel)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "gpu_carry")
    parser.add_argument("--limit-mib", type=float, default=60.0)
    parser.add_argument("--suite", default="libero_object")
    parser.add_argument("--task", type=int, default=0)
    parser.add_argument(
        "--python", default="3.12", help="the device's Python (3.12; this one's, to try it here)"
    )
    args = parser.parse_args(argv)
    wheels = args.out / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for old in wheels.glob("*.whl"):
        old.unlink()
    for wheel in download(wheels, args.python):
        if wheel.name.startswith("mujoco-"):
            slim(wheel)
    sys.path.insert(0, str(ROOT))
    from bench.gpu_scene import build

    about = build(args.out / "scene.mjb.xz", args.suite, args.task)
    (args.out / "run.sh").write_text(RUN_SH)
    size = folder_bytes(args.out)
    for path in sorted(p for p in args.out.rglob("*") if p.is_file()):
        print(f"{path.stat().st_size / 2**20:7.2f} MiB  {path.relative_to(args.out)}")
    print(
        f"{size / 2**20:7.2f} MiB  in all (limit {args.limit_mib:g} MiB); scene: "
        f"{about['drawn_faces']} faces drawn, the whole scene's {about['drawn_faces_whole_scene']}"
    )
    return 0 if size <= args.limit_mib * 2**20 else 1


if __name__ == "__main__":
    sys.exit(main())
