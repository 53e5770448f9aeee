"""How results are reported: HTML pages with plots and verdicts, run-vs-run compare.

Reads the files `harness.run` wrote and never measures. `python -m harness.report`.
"""
