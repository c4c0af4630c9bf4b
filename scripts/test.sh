#!/usr/bin/env bash
# Set up (scripts/setup.sh test: the runtime plus the [test] extra) and run every
# test: the C core's tests (plain and with AddressSanitizer +
# UndefinedBehaviorSanitizer), the packaging check (scripts/check_dist.sh: sdist
# and wheel built, each installed in a fresh venv), then pytest (including a
# quick subset of Thunder's own tests run with memfuse, and every notebook in
# notebooks/ executed with small sizes; the full peer run is scripts/peer.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
make -C tests/c test
make -C tests/c sanitize
bash scripts/check_dist.sh
.venv/bin/python -m pytest -q tests "$@"
