"""`python -m ddptui`: the same as the `ddptui` command."""

import sys

from ddptui.cli import main

sys.exit(main())
