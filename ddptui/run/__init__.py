"""Loaded in the run's own process, the one that owns a run's ranks: what every owned run shares
(owned, membership, outcome, ports, readings, the input watch), builtin/ (the supervisor), script/."""
