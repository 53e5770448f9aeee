"""`python -m harness.gate`."""

import sys

from harness.exits import run_module

sys.exit(run_module("harness.gate.cli"))
