"""Dashboards served by the run's own process: its socket's host, the check of each order it
is sent, the refusals said and summed."""
