#!/usr/bin/env bash
# Create .venv (if missing) and install thunder_memfuse with the pinned test stack.
# Idempotent: a second run only rebuilds the extension.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# torch 2.13.0+cpu is the pinned build (see docs/ARCHITECTURE.md "Pinned stack").
.venv/bin/python -m pip install --quiet -e ".[test]"
# An editable install does not place top-level .pth files; a wheel install does.
# Put the Thunder import shim's .pth in place so `import thunder` works first too.
cp thunder_memfuse_compat.pth "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"
