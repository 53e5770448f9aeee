"""How one measurement is taken: clocks, statistics, profiler counters and Chrome traces,
the machine's fingerprint, copy bandwidth and py-spy flamegraphs.

Imports nothing else of `harness` (tests/test_layout.py checks it), so every other part
can build on it.
"""
