#!/usr/bin/env bash
# Build a LeRobot (0.4.4) dataset read/write env outside the project venv.
# Usage: bash lerobot_env.sh [ENV_DIR]   (default /tmp/lrenv)
set -euo pipefail
ENV=${1:-/tmp/lrenv}
PY=/root/.pyenv/versions/3.11.7/bin/python
TORCH_WHL=/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl

command -v ffprobe >/dev/null || { apt-get update -q && apt-get install -y -q ffmpeg; }   # libav* 5.1 for torchcodec
$PY -m venv "$ENV"
"$ENV/bin/pip" install -q "$TORCH_WHL"
"$ENV/bin/pip" install -q --no-deps lerobot==0.4.4        # pins torch<2.11, torchvision<0.26, torchcodec<0.11: ignored
"$ENV/bin/pip" install -q torchvision==0.28.0 torchcodec==0.13.0 \
  "datasets>=4.0.0,<5.0.0" "huggingface-hub>=0.34.2,<0.36.0" "av>=15.0.0,<16.0.0" \
  "jsonlines>=4.0.0,<5.0.0" "packaging>=24.2,<26.0" "einops>=0.8.0,<0.9.0" \
  "draccus==0.10.0" "termcolor>=2.4.0,<4.0.0" "accelerate>=1.10.0,<2.0.0" || true  # pip exits 0; conflicts are only reported

# torchvision 0.28.0 on PyPI is a CUDA build: its _C.so needs libtorch_cuda, absent from +cpu torch,
# so `import torchvision` dies with "operator torchvision::nms does not exist". Define the two schemas
# its _meta_registrations needs when _C.so cannot load (lerobot.datasets only uses pure-Python torchvision).
SP=$("$ENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cat > "$SP/_lr_tv_cpu_shim.py" <<'EOF'
"""Let PyPI's torchvision (CUDA build) import beside a CPU-only torch (see lerobot_env.sh)."""
import importlib.abc
import importlib.machinery
import os
import sys


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "torchvision":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            return None
        import torch

        so = os.path.join(list(spec.submodule_search_locations)[0], "_C.so")
        try:
            torch.ops.load_library(so)
        except OSError:
            lib = torch.library.Library("torchvision", "DEF")
            lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            torch._lr_tv_cpu_shim_lib = lib  # keep the Library alive
        return None


sys.meta_path.insert(0, _Hook())
EOF
echo "import _lr_tv_cpu_shim" > "$SP/_lr_tv_cpu_shim.pth"

HF_HUB_OFFLINE=1 "$ENV/bin/python" -c "
import torch, torchvision, torchcodec, av, lerobot.datasets.lerobot_dataset as m
from torchcodec.decoders import VideoDecoder
print('lerobot env ok:', 'torch', torch.__version__, 'torchvision', torchvision.__version__, 'torchcodec', torchcodec.__version__, 'av', av.__version__)"
