"""`python -m ddptui.rank.wrap SCRIPT [ARGS]` (or `-m MODULE [ARGS]`): ddptui/rank/wrap/runner.py."""

import sys

from ddptui.rank.wrap.runner import main

sys.exit(main(sys.argv[1:]))
