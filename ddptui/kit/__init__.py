"""The rank-side kit under ddptui's own name, for the code that runs inside a user's process
(ddptui.init, run.loader, run.elastic, the framework callbacks, the wrapper and its sidecar).

The kit is trainer's protocol, telemetry and elastic packages, its prefetcher, sampler and compat:
the files the built-in loop imports as `trainer`, loaded here from the same folder. A user's own
trainer.py or trainer/ beside their script comes first on sys.path and hides that top-level name
(every rank failed: "'trainer' is not a package"); under this one it does not matter, and the
user's `import trainer` still finds theirs. The kit's modules import one another relatively so
that they work under either name (tests/project/test_layers.py holds them to it).
"""

import os

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
__path__ = [os.path.join(_ROOT, "trainer")]
