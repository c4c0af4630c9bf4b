"""One benchmark row in a process of its own, shared by the benchmarks that need it
(real_sizes.py, real_models.py, depth_scaling.py).

A row run in a fresh interpreter sees nothing of the rows before it: no compiled code, no caches in
memory, no garbage that a collection mid-step could free and so lower the measured peak.  The child
runs the same script with its own hidden arguments and prints its result as one line, `RESULT <json>`
(emit); the parent reads that line back (run).

The child imports thunder_memfuse from the checkout this file lies in (its root goes first on the
child's PYTHONPATH, and on the parent's sys.path when it imports this module), never from whatever
is installed: `pip install -e` points site-packages at one checkout, and a benchmark run from
another (a worktree of an older commit, say) would otherwise measure the installed code under the
other commit's name.  A checkout whose extension is not built then fails its rows, visibly.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

PREFIX = "RESULT "
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def emit(result) -> None:
    """In the child: print the row's result (anything json can write) for the parent."""
    print(PREFIX + json.dumps(result), flush=True)


def run(script: str, args, env=None, timeout=None):
    """Run `python script *args` in a fresh process: (its emitted result, None), or (None, why not):
    the last line of its standard error, or that it ran past timeout seconds."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (ROOT, env.get("PYTHONPATH")) if x)
    try:
        p = subprocess.run([sys.executable, script, *map(str, args)], capture_output=True, text=True,
                           env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"over {timeout:.0f} s"
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith(PREFIX)), None)
    if line is None:
        return None, (p.stderr.strip().splitlines() or [f"no result (exit status {p.returncode})"])[-1][:200]
    return json.loads(line[len(PREFIX):]), None
