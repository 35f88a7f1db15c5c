"""The user's runs on this host: the runtime folder, opened once (runtime_dir.py), and a record per run
(registry.py) that the run's process writes and `ls`, `attach` and `ddptui web` read."""
