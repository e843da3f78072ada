"""`python -m planner` runs the CLI."""

import sys

from planner.cli import main

sys.exit(main())
