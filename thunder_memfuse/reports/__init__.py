"""Layer 4, measurement and reports: what memfuse did and what it saved, measured and drawn.

    _traces.py   the traces memfuse returned and their schedules (what the others start from)
    measure.py   measured peaks: torch.profiler on CPU, torch.cuda.max_memory_allocated on CUDA
    _compare.py  compare(): the memory model against the profiler, step by step
    savings.py   savings(): a step with and without memfuse, beside eager (and its command line)
    _report.py   report() and format_report()
    plot.py      plot_timeline, plot_comparison, plot_memory_over_time
    _progress.py what a long measurement is doing, on stderr

Within the layer imports run one way: _traces, measure and _progress import none of the others;
_compare imports measure and _traces; savings imports _compare, measure and _progress; _report
imports _traces, _compare and savings; plot imports _traces.  Below it: integration/, regions/ and
the base modules; never the public modules above it (thunder_memfuse.measure, .savings, .plot:
re-exports of this package).  tests/test_layers.py checks it; this __init__ imports nothing.
"""
