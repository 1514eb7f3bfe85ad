#!/usr/bin/env bash
# Set up from nothing and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
. .venv/bin/activate
python -m pytest -q "$@"
