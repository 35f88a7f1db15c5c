"""`python -m ddptui.wrap SCRIPT [ARGS]` (or `-m MODULE [ARGS]`) between torchrun (or srun) and an
unmodified script, for `ddptui attach`: the public name of ddptui/rank/wrap (runner.py)."""

import sys

if __name__ == "__main__":
    from ddptui.rank.wrap.runner import main

    sys.exit(main(sys.argv[1:]))
