"""The elastic world: forming and re-forming process groups, commands agreed at a step, rollback
points for crash recovery, and a process's tie to its parent."""
