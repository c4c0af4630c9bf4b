"""Layer 3, the Thunder integration: what plugs memfuse into a Thunder compilation.

    transform.py      MemFuse / memfuse, the Thunder transform (thunder_memfuse.MemFuse is this)
    _regroup.py       a planned trace rebuilt: its groups as memfuse's fusion bound symbols
    executor.py       memfuse's fusion executor and the callables of its regions
    fusion_pass.py    the fusion pass memfuse runs in the place of nvFuser / torch.compile
    _rematerialize.py the pass's rematerialization (cuts solved in C)
    _planning.py      a trace handed to the C planner: plan_trace, saved storages, freed gradients
    _records.py       one record per bound symbol for the C reader
    _aliases.py       which outputs share an argument's storage
    _recompute.py     cheap ops run again instead of kept (the copies the planner asks for)
    _step.py          a training step's forward regrouped within the backward's peak
    _saved_set.py     the forward's saved set within a memory budget
    attention.py      CPU attention kept whole (thunder_memfuse.attention re-exports it)
    _misuse.py        a MemFuse class passed where an instance belongs

It imports the base modules (thunder_memfuse/*.py) and regions/, never reports/ or the public
modules above it (tests/test_layers.py; docs/ARCHITECTURE.md "Layers of the package").  This
__init__ imports nothing, so that importing one module of the layer loads only what it needs.
"""
