"""`python -m harness.report`."""

import sys

from harness.report.cli import main

sys.exit(main())
