"""The parent's side of a run it owns: processes, membership, health, readings, how it ends."""
