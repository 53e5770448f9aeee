"""`python -m harness.bisect`."""

import sys

from harness.exits import run_module

sys.exit(run_module("harness.bisect.cli"))
