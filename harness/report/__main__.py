"""`python -m harness.report`."""

import sys

from harness.exits import run_module

sys.exit(run_module("harness.report.cli"))
