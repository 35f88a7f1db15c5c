"""`python -m ddptui`: the same as the `ddptui` command."""

import os
import sys

# `-m` puts the working folder first on sys.path, where a project's own trainer.py would hide
# ddptui's trainer package: that is imported first, then the folder is put back (a script's
# `-m MODULE` is looked for there). Its submodules come from the package found here.
if sys.path and os.path.abspath(sys.path[0] or ".") == os.getcwd():
    first = sys.path.pop(0)
    import trainer  # noqa: F401

    sys.path.insert(0, first)

from ddptui.cli import main  # noqa: E402

sys.exit(main())
