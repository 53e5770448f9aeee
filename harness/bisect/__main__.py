"""`python -m harness.bisect`."""

import sys

from harness.bisect.cli import main

sys.exit(main())
