#!/usr/bin/env bash
# Fill wheels/ (git-ignored) with what benchmarks/gpu_check.sh installs on a lent GPU machine that
# has Python 3.12 and a CUDA build of torch but no Thunder and no network: lightning-thunder 0.2.6
# and its pure-Python / small binary dependencies (never torch), pytest, and the build tools for
# `setup.py build_ext --inplace` (setuptools >= 77).  Run it here, with network, before a GPU session; the
# session carries wheels/ to the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-wheels}
mkdir -p "$DEST"
PY=${PYTHON:-python3}
# Exact pins where the project pins; the rest float to what resolves for Python 3.12.
PKGS=(
  "lightning-thunder==0.2.6"
  "looseversion==1.3.0"
  "lightning-utilities>0.7.0"
  "packaging>=24"
  "typing_extensions>=4.10.0"
  "numpy"
  "networkx>=3.3"
  "optree>=0.12.1"
  "opt_einsum>=3.3.0"
  "mpmath<1.4.0"
  "dill>=0.3.8"
  "pytest==9.2.0"
  "iniconfig>=2"
  "pluggy>=1.6,<2"
  "pygments>=2.15"
  "setuptools>=68"
  "wheel"
)
# --no-deps: every dependency is listed above (the resolver would otherwise pull torch and CUDA).
"$PY" -m pip download --dest "$DEST" --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any "${PKGS[@]}"
ls -l "$DEST"
