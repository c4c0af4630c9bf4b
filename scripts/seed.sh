#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the main job: the seed comparison on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m thunder_memfuse.seed "$@"
