"""ddptui: a terminal dashboard that launches PyTorch DDP training and steers it live.

This package is the parent process (CLI, supervisor, Textual app); it never imports torch to draw.
"""

__version__ = "0.1.0"
