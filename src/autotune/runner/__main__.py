"""`python -m autotune.runner SPEC.json`: one rank of a trial (see autotune.runner.main)."""

import sys

from .main import main

sys.exit(main())
