"""How results are reported: HTML pages with plots and verdicts, run-vs-run compare, the
history across runs, and markdown summaries for CI.

Reads the files `harness.run` wrote and never measures. `python -m harness.report`.
"""
