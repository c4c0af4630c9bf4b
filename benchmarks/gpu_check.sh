#!/usr/bin/env bash
# The one command to run on a lent GPU machine (Python 3.12, a CUDA build of torch, nvcc, no
# Thunder, no network), from the repository root or anywhere:
#
#     bash benchmarks/gpu_check.sh            # reports under $OUT (default ./out/gpu)
#
# Stages: environment -> install Thunder 0.2.6 and missing deps from wheels/ (filled beforehand by
# benchmarks/fetch_gpu_wheels.sh) into $SITE (on PYTHONPATH) -> build the extension in place
# (setup.py build_ext --inplace) -> cuda_status -> pytest tests/test_gpu.py -> benchmarks/seed_gpu.py ->
# benchmarks/fsdp_gpu.py (Thunder FSDP, world size 1 over NCCL, with and without memfuse: gradients,
# max_memory_allocated, collective positions) -> tests/test_codegen.py if time is left.  Each stage has a time limit inside an overall budget
# (GPU_CHECK_BUDGET seconds, default 450 < 8 minutes); a failing stage is recorded in
# $OUT/gpu_check.json and the script goes on.  Exit status 0 unless the summary itself fails.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/out/gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
SITE=${GPU_CHECK_SITE:-/tmp/memfuse_site}
mkdir -p "$SITE"
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export OUT PY SITE
BUDGET=${GPU_CHECK_BUDGET:-450}
START=$SECONDS
STAGES=$OUT/stages.tsv
: > "$STAGES"

# stage NAME LIMIT_S CMD...: run with a timeout (capped by what is left of the budget), log to
# $OUT/NAME.log, record "name rc seconds" in $STAGES.
stage() {
  local name=$1 limit=$2
  shift 2
  local left=$((BUDGET - (SECONDS - START)))
  if [ "$left" -le 5 ]; then
    printf '%s\t%s\t%s\n' "$name" "skipped-no-time" 0 >> "$STAGES"
    echo "== $name: skipped (budget spent)"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit ${limit}s)"
  local t0=$SECONDS
  if [ "$(type -t "$1")" = "function" ]; then
    # timeout runs programs, not shell functions: hand the function to a child bash
    timeout --kill-after=10 "$limit" bash -c "$(declare -f "$1"); $*" > "$OUT/$name.log" 2>&1
  else
    timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  fi
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >> "$STAGES"
  tail -n 15 "$OUT/$name.log"
  echo "== $name: rc=$rc in $((SECONDS - t0))s"
  return 0
}

env_info() {
  nvidia-smi || true
  command -v nvcc && nvcc --version | tail -n 2
  "$PY" -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available()); print(torch.cuda.get_device_name() if torch.cuda.is_available() else '-')"
}

install_deps() {
  # Thunder and whatever else of wheels/ the machine lacks (never torch), into $SITE with
  # --no-deps: the image's Python may not be writable, and pip --target would otherwise try to
  # reinstall torch.  A wheel whose distribution is already installed is skipped.
  if [ ! -d wheels ]; then echo "wheels/ is missing: run benchmarks/fetch_gpu_wheels.sh where there is network" >&2; return 3; fi
  local need
  need=$("$PY" - wheels <<'PYEOF'
import glob, os, sys
from importlib import metadata
# the floors of lightning-thunder 0.2.6's requirements, and setuptools >= 77 for pyproject.toml's
# SPDX license string: an older copy on the image is shadowed by the carried wheel
FLOORS = {"setuptools": (77,), "networkx": (3, 3), "optree": (0, 12, 1), "typing_extensions": (4, 10),
          "dill": (0, 3, 8), "lightning_utilities": (0, 7), "opt_einsum": (3, 3), "looseversion": (1, 3)}
def vtuple(v):
    out = []
    for part in v.split("."):
        digits = "".join(c for c in part if c.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)
for whl in sorted(glob.glob(os.path.join(sys.argv[1], "*.whl"))):
    name = os.path.basename(whl).split("-")[0]
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        print(whl)
        continue
    if vtuple(have) < FLOORS.get(name.lower(), ()):
        print(whl)
PYEOF
) || return $?
  echo "installing into $SITE:" $need
  [ -z "$need" ] || "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" $need
}

build_ext() {
  # in place (thunder_memfuse/_C*.so), found through PYTHONPATH: nothing to install
  "$PY" setup.py -q build_ext --inplace || return $?
  "$PY" -c "import thunder_memfuse._C as C; print('built', C.__file__)"
}

cuda_status() {
  "$PY" - "$OUT/cuda_status.json" <<'PYEOF'
import json, sys
import thunder_memfuse
st = thunder_memfuse.cuda_status()
json.dump(st, open(sys.argv[1], "w"), indent=1, default=str)
print(json.dumps({k: st[k] for k in ("can_compile", "can_run")}))
for lib in ("driver", "nvrtc", "cublas", "cublaslt"):
    e = st[lib]
    print(lib, "found" if e["found"] else "NOT FOUND", e.get("path") or e.get("error"), e.get("version"))
sys.exit(0 if st["can_run"] else 4)
PYEOF
}

stage env 30 env_info
stage install 120 install_deps
if [ "${GPU_CHECK_SKIP_BUILD:-0}" = 1 ]; then
  printf '%s\t%s\t%s\n' build skipped 0 >> "$STAGES"   # dry runs of this script only
else
  stage build 180 build_ext
fi
stage status 60 cuda_status
stage test_gpu 200 "$PY" -m pytest -q -rs tests/test_gpu.py -p no:cacheprovider --junitxml "$OUT/test_gpu.xml"
stage seed 200 "$PY" benchmarks/seed_gpu.py --out "$OUT/seed_gpu.json"
stage fsdp 120 "$PY" benchmarks/fsdp_gpu.py --out "$OUT/fsdp_gpu.json"
stage test_codegen 120 "$PY" -m pytest -q -rs tests/test_codegen.py -p no:cacheprovider --junitxml "$OUT/test_codegen.xml"

"$PY" - "$OUT" <<'PYEOF'
import json, os, re, sys
out = sys.argv[1]
stages = []
for line in open(os.path.join(out, "stages.tsv")):
    name, rc, secs = line.rstrip("\n").split("\t")
    log = os.path.join(out, name + ".log")
    tail = open(log, errors="replace").read()[-3000:] if os.path.exists(log) else ""
    stages.append({"stage": name, "rc": rc, "seconds": int(secs), "ok": rc == "0", "log_tail": tail})
report = {"stages": stages}
for name in ("test_gpu", "test_codegen"):
    log = os.path.join(out, name + ".log")
    if os.path.exists(log):
        m = re.findall(r"^=*\s*(.*\b(?:passed|failed|skipped|error)\b.*?)\s*=*$", open(log, errors="replace").read(), re.M)
        report[name + "_summary"] = m[-1] if m else None
for name in ("cuda_status", "seed_gpu", "fsdp_gpu"):
    p = os.path.join(out, name + ".json")
    if os.path.exists(p):
        try:
            report[name] = json.load(open(p))
        except Exception as e:
            report[name] = {"error": repr(e)}
json.dump(report, open(os.path.join(out, "gpu_check.json"), "w"), indent=1, default=str)
print("\n%-14s %-16s %7s" % ("stage", "rc", "seconds"))
for s in stages:
    print("%-14s %-16s %7d" % (s["stage"], s["rc"], s["seconds"]))
for name in ("test_gpu", "test_codegen"):
    if report.get(name + "_summary"):
        print(f"{name}: {report[name + '_summary']}")
seed = report.get("seed_gpu") or {}
if seed.get("results"):
    print("\n%-18s %-12s %9s %9s %4s" % ("config", "function", "peak MiB", "ms/call", "ok"))
    for r in seed["results"]:
        print("%-18s %-12s %9s %9s %4s  %s" % (
            r["config"], r["function"], "%.2f" % r["peak_mib"] if "peak_mib" in r else "-",
            "%.3f" % r["ms_median"] if "ms_median" in r else "-",
            {True: "yes", False: "NO"}.get(r.get("ok"), "-"), r.get("error", "")[:50]))
fsdp = report.get("fsdp_gpu") or {}
if fsdp.get("results"):
    print("\n%-6s %12s %12s %10s %10s %10s" % ("fsdp", "thunder MiB", "memfuse MiB", "thunder ms", "memfuse ms", "grads ok"))
    for r in fsdp["results"]:
        if "error" in r:
            print("%-6s error: %s" % (r["strategy"], r["error"][:80]))
            continue
        print("%-6s %12.2f %12.2f %10.2f %10.2f %10s" % (
            r["strategy"], r["thunder"]["peak_mib"], r["memfuse"]["peak_mib"], r["thunder"]["step_ms"],
            r["memfuse"]["step_ms"], {True: "yes", False: "NO"}.get(r.get("grads_close"), "-")))
print("\nreport:", os.path.join(out, "gpu_check.json"))
PYEOF
exit 0
