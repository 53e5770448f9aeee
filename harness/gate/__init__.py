"""The CI performance regression gate: exact counters against a baseline, in-process
speed invariants, and a paired A/B check against a git revision. `python -m harness.gate`.
"""
