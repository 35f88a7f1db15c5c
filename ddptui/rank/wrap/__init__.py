"""The wrapped rank: `python -m ddptui.rank.wrap` between torchrun (or srun) and an unmodified
script; runner.py runs the script, rankwatch.py watches it from inside, sidecar.py beside it."""
