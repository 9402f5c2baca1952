"""`python -m pilot` runs the `pilot` command line."""

import sys

from pilot.cli import main

sys.exit(main())
