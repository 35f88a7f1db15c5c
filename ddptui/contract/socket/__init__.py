"""The run <-> dashboard socket as a dashboard's process uses it (viewer.py) and both ends frame it
(viewers.py); the run's own end is ddptui/run/host/."""
