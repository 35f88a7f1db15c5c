"""Your script's side of ddptui, run inside each of its ranks: `run = ddptui.init()` (session.py),
the dashboard's orders, run.loader(), run.elastic() and what the run reports.
"""
