"""The dashboard's widgets: each renders one part of a run-state view and nothing else
(no NVML, psutil or torch in here; the supervisor and the ranks gather the figures).
"""
