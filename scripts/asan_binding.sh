#!/usr/bin/env bash
# Build thunder_memfuse._C with AddressSanitizer in a scratch copy of the tree and run the binding's tests
# against it: the interpreter preloads libasan (LD_PRELOAD) and allocates with malloc (PYTHONMALLOC=malloc),
# so ASan sees every object the binding touches.  Leak detection is off here (the interpreter itself leaks
# at exit); tests/test_binding_leaks.py checks the binding's references.
#   bash scripts/asan_binding.sh [pytest args]      (default: the plan/simulate/hardening/property tests)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=$ROOT/.venv/bin/python
[ -x "$PY" ] || bash scripts/setup.sh
CC=${CC:-gcc}
LIBASAN=$("$CC" -print-file-name=libasan.so)
[ -f "$LIBASAN" ] || { echo "asan_binding: libasan.so not found by $CC" >&2; exit 2; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/memfuse_asan.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
git ls-files -z | xargs -0 tar -cf - | tar -xf - -C "$WORK"
cd "$WORK"
CFLAGS="-fsanitize=address -fno-omit-frame-pointer -g -O1" LDFLAGS="-fsanitize=address" \
    "$PY" setup.py -q build_ext --inplace >build.log 2>&1 || { tail -30 build.log; exit 1; }
nm -D thunder_memfuse/_C*.so | grep -q __asan_report || { echo "asan_binding: _C is not instrumented" >&2; exit 1; }
cd tests
TESTS=("$@")
if [ ${#TESTS[@]} -eq 0 ]; then
    # RSS figures mean nothing under ASan (shadow memory, quarantine): the budget test measures RSS
    TESTS=(test_hardening.py test_properties.py test_plan.py
           --deselect test_hardening.py::test_huge_max_states_stays_within_the_dp_memory_budget)
fi
PYTHONPATH="$WORK" LD_PRELOAD="$LIBASAN" PYTHONMALLOC=malloc \
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:allocator_may_return_null=1 \
    "$PY" -c "import thunder_memfuse._C as c, sys; assert c.__file__.startswith(sys.argv[1]), c.__file__" "$WORK"
PYTHONPATH="$WORK" LD_PRELOAD="$LIBASAN" PYTHONMALLOC=malloc \
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:allocator_may_return_null=1 \
    "$PY" -m pytest -q -p no:cacheprovider "${TESTS[@]}"
