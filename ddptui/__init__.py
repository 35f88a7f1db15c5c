"""ddptui: a terminal dashboard that launches PyTorch DDP training and steers it live.

This package is the parent process (CLI, supervisor, Textual app); it never imports torch to draw.
"""

__version__ = "0.1.0"


def init(report: str | None = None):
    """`run = ddptui.init()` in your training script: see ddptui.rank.api.session.Run. Imported here only
    when called, so `import ddptui` stays light (no torch, no Textual)."""
    from ddptui.rank.api.session import init as _init

    return _init(report)
