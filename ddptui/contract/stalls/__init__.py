"""Stall verdicts, one home for every kind of run: health.py judges a world's members from their
steps and heartbeats (the built-in loop), scripts.py ranks seen from outside (a script's run, attach).
Pure: the watchers (the watchdog, a script's watch, attach's remote watch) gather and act."""
