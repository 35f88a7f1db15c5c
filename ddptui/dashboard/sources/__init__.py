"""Runs ddptui watches but does not own: ranks started elsewhere (attach), a recorded log (replay)."""
