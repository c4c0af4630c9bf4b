#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run every test: the C core's tests (plain and
# with AddressSanitizer + UndefinedBehaviorSanitizer), then pytest (including a
# quick subset of Thunder's own tests run with memfuse; the full peer run is
# scripts/peer.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
make -C tests/c test
make -C tests/c sanitize
.venv/bin/python -m pytest -q tests "$@"
