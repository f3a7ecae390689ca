"""`python -m kvswap` runs the console script."""

import sys

from kvswap.cli import main

sys.exit(main())
