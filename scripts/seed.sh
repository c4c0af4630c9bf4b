#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the main job: the seed comparison on CPU.
# With --plot PATH the setup also installs the [plot] extra (matplotlib).
set -euo pipefail
cd "$(dirname "$0")/.."
extra=""
for arg in "$@"; do
    case "$arg" in --plot|--plot=*) extra=plot ;; esac
done
bash scripts/setup.sh $extra
.venv/bin/python benchmarks/seed.py "$@"
