"""The run <-> dashboard socket, both ends: the run's process serves (host.py, each order checked
by order_check.py), a dashboard's process connects (viewer.py); viewers.py frames, dashboards.py orders."""
