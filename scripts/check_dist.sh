#!/usr/bin/env bash
# Packaging check: build the sdist and, from it, the wheel (python -m build), then
# install each (and the work tree, editable) into its own fresh venv and check there that
#   1. `import thunder` works as the first import (the compat .pth is in place),
#   2. a thunder.jit with memfuse gives eager's numbers and a report,
#   3. `pip uninstall` leaves an interpreter that starts without a word on stderr,
#   4. a stray thunder_memfuse_compat.pth without its module prints nothing either.
# The fresh venvs install thunder_memfuse alone (--no-deps); torch and Thunder come
# from .venv's site-packages through a path entry, so nothing is downloaded.
#
#   bash scripts/check_dist.sh          (after scripts/setup.sh test; PY= another interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/memfuse_dist.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
DEPS=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export PIP_DISABLE_PIP_VERSION_CHECK=1

echo "== check_dist: building sdist and wheel"
"$PY" -m build --no-isolation --outdir "$WORK/dist" . >"$WORK/build.log" 2>&1 || { tail -n 40 "$WORK/build.log"; exit 1; }
SDIST=$(ls "$WORK"/dist/*.tar.gz)
WHEEL=$(ls "$WORK"/dist/*.whl)
SDIST_FILES=$(tar -tzf "$SDIST")
for f in csrc/core/mf_core.h csrc/python/mf_py.h thunder_memfuse_compat.pth LICENSE MANIFEST.in; do
    grep -q "/$f\$" <<<"$SDIST_FILES" || { echo "check_dist: $f is missing from the sdist"; exit 1; }
done
WHEEL_FILES=$("$PY" -c 'import sys, zipfile; print("\n".join(zipfile.ZipFile(sys.argv[1]).namelist()))' "$WHEEL")
grep -qx "thunder_memfuse_compat.pth" <<<"$WHEEL_FILES" || { echo "check_dist: the wheel has no .pth"; exit 1; }
# every module of the package, in each of its folders (pyproject.toml [tool.setuptools] packages)
for f in $(find thunder_memfuse -name '*.py' -not -path '*/__pycache__/*' | sort); do
    grep -qx "$f" <<<"$WHEEL_FILES" || { echo "check_dist: $f is missing from the wheel (pyproject.toml packages)"; exit 1; }
    grep -q "/$f\$" <<<"$SDIST_FILES" || { echo "check_dist: $f is missing from the sdist"; exit 1; }
done

fresh_venv() {  # fresh_venv DIR: a venv that sees .venv's packages after its own
    "$PY" -m venv --without-pip "$1"
    local sp
    sp=$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$DEPS" >"$sp/zz_memfuse_check_deps.pth"
}

check_env() {  # check_env VENV LABEL [EXPECTED_DIR]: thunder_memfuse must come from EXPECTED_DIR (default site-packages)
    local v=$1 label=$2
    (cd "$WORK" && MEMFUSE_EXPECT_DIR="${3:-site-packages}" "$v/bin/python" - <<'PY'
import os
import thunder  # first, before thunder_memfuse: the .pth applied the import shim
import torch
import thunder_memfuse as tm
assert os.environ["MEMFUSE_EXPECT_DIR"] in tm.__file__, tm.__file__

def fn(x, w):
    return torch.relu(x @ w).sum(0)

torch.manual_seed(0)
x, w = torch.randn(8, 8), torch.randn(8, 8)
jfn = thunder.jit(fn, transforms=[tm.memfuse])
torch.testing.assert_close(jfn(x, w), fn(x, w))
assert "forward" in tm.report(jfn)
PY
    ) || { echo "check_dist: $label: import thunder / jit with memfuse failed"; exit 1; }
    # uninstall, then an interpreter start must be silent
    "$PY" -m pip --python "$v/bin/python" uninstall -y -q thunder_memfuse >/dev/null
    local err
    err=$(cd "$WORK" && "$v/bin/python" -c "pass" 2>&1)
    [ -z "$err" ] || { echo "check_dist: $label: after uninstall the interpreter prints: $err"; exit 1; }
    echo "check_dist: $label ok (import thunder first, jit with memfuse, clean uninstall)"
}

fresh_venv "$WORK/v_wheel"
"$PY" -m pip --python "$WORK/v_wheel/bin/python" install -q --no-deps "$WHEEL"
check_env "$WORK/v_wheel" wheel

fresh_venv "$WORK/v_sdist"
"$PY" -m pip --python "$WORK/v_sdist/bin/python" install -q --no-deps --no-build-isolation "$SDIST" \
    >"$WORK/sdist_install.log" 2>&1 || { tail -n 40 "$WORK/sdist_install.log"; exit 1; }
check_env "$WORK/v_sdist" sdist

# editable: the build writes the .pth into the editable wheel too (setup.py)
fresh_venv "$WORK/v_editable"
"$PY" -m pip --python "$WORK/v_editable/bin/python" install -q --no-deps --no-build-isolation -e . \
    >"$WORK/editable_install.log" 2>&1 || { tail -n 40 "$WORK/editable_install.log"; exit 1; }
check_env "$WORK/v_editable" editable "$(pwd)/thunder_memfuse"

# a .pth left behind without its module (a hand copy, an interrupted uninstall) stays silent
fresh_venv "$WORK/v_stray"
cp thunder_memfuse_compat.pth "$("$WORK/v_stray/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"
err=$(cd "$WORK" && "$WORK/v_stray/bin/python" -c "pass" 2>&1)
[ -z "$err" ] || { echo "check_dist: a stray .pth prints: $err"; exit 1; }
echo "check_dist: stray .pth ok"
