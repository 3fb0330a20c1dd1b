"""`python -m pytest_gap.cli`: the `gap` command where no console script is on the PATH (the
evaluation server's children, `gap eval`'s workers, a managed policy server)."""

import sys

from pytest_gap.cli import main

sys.exit(main())
