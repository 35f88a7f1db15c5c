"""Loaded in a dashboard's process, and nowhere else (never torch): the Textual view and its screens,
the runs ddptui does not own (sources/), starting a run's process (background.py), `ddptui web`."""
