"""Figures for the planner's guards (issue 10): the DP memory budget and Ctrl-C latency.

    .venv/bin/python benchmarks/hardening.py

Each measurement runs in a fresh child process so that ru_maxrss (peak RSS) is its own:
- a 200-op fork/join (tests/test_hardening.py fork_join) planned with max_states=2**62, which without
  the budget grows without bound: wall time, DP states, peak RSS above the state after a warm-up plan,
  optimal;
- the same with smaller budgets (_C.plan(_dp_max_bytes=)) to show the footprint follows the budget;
- SIGINT sent 0.3 s into that plan from a timer thread: time until KeyboardInterrupt (5 runs).
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests")

CHILD = r"""
import json, os, resource, signal, sys, threading, time
sys.path.insert(0, {tests!r})
from test_hardening import fork_join
from thunder_memfuse import _C
spec = fork_join()
_C.plan(**spec, max_states=10)
mode, budget = sys.argv[1], int(sys.argv[2])
if mode == "budget":
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    d = _C.plan(**spec, max_states=2**62, _dp_max_bytes=budget)
    print(json.dumps(dict(s=time.perf_counter() - t, states=d["states"], optimal=d["optimal"],
                          rss_mib=(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - r0) / 1024)))
else:
    sent = []
    def fire():
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)
    threading.Timer(0.3, fire).start()
    try:
        _C.plan(**spec, max_states=2**62)
        print(json.dumps(dict(latency_ms=None)))
    except KeyboardInterrupt:
        print(json.dumps(dict(latency_ms=(time.perf_counter() - sent[0]) * 1e3)))
"""


def child(mode, budget=0):
    r = subprocess.run([sys.executable, "-c", CHILD.format(tests=TESTS), mode, str(budget)], capture_output=True,
                       text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    print("200-op fork/join, max_states=2**62")
    print(f"{'DP budget':>12} {'time s':>8} {'states':>9} {'peak RSS above warm-up MiB':>27} optimal")
    for mib in (16, 64, 256):
        d = child("budget", mib << 20)
        print(f"{mib:>8} MiB {d['s']:>8.2f} {d['states']:>9} {d['rss_mib']:>27.1f} {d['optimal']}")
    lat = sorted(child("sigint")["latency_ms"] for _ in range(5))
    print("SIGINT -> KeyboardInterrupt, ms (5 runs, sorted): " + ", ".join(f"{x:.1f}" for x in lat))


if __name__ == "__main__":
    main()
