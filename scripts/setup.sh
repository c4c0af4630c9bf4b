#!/usr/bin/env bash
# Create .venv (if missing) and install thunder_memfuse (editable) with what a job needs:
#
#   bash scripts/setup.sh          runtime only: lightning-thunder 0.2.6 and the CPU build of torch 2.13.0
#   bash scripts/setup.sh plot     adds the [plot] extra: matplotlib (what seed.sh --plot needs)
#   bash scripts/setup.sh test     adds the [test] extra: pytest, matplotlib, nbclient/ipykernel for the
#                                  notebooks, Thunder's test dependencies, and the NVIDIA NVRTC/cuBLAS
#                                  wheels whose headers and symbol tables tests/test_cublaslt.py checks
#
# Idempotent: a second run only rebuilds the extension.  The build places
# thunder_memfuse_compat.pth in site-packages (setup.py), so `import thunder` works
# first in .venv, and `pip uninstall thunder_memfuse` removes it again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# torch 2.13.0+cpu is the pinned build (see docs/ARCHITECTURE.md "Pinned stack"); pinning it here
# keeps pip from choosing a newer CUDA build of torch.
target="."
[ "${1:-}" = test ] && target=".[test]"
[ "${1:-}" = plot ] && target=".[plot]"
# pip is quiet, so say what it is doing: a first run downloads torch and builds the extension
echo "setup.sh: installing thunder_memfuse ($target) and torch 2.13.0 into .venv (a first run downloads torch and builds the C extension) ..." >&2
.venv/bin/python -m pip install --quiet -e "$target" "torch==2.13.0"
echo "setup.sh: .venv ready" >&2
