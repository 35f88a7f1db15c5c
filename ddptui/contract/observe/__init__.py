"""What ddptui reads of a rank from outside its Python: its output and the figures it prints,
its stacks, NCCL's flight recorder, stall verdicts; for a script's run, attach and the wrapped rank.
"""
