"""`python -m ddptui.wrap SCRIPT [ARGS]` (or `-m MODULE [ARGS]`): ddptui/wrap/runner.py."""

import sys

from ddptui.wrap.runner import main

sys.exit(main(sys.argv[1:]))
