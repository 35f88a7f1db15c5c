"""A run of your own training script that ddptui owns: launched as torchrun would launch it, its
processes and output folded into events, steered through `ddptui.init()` where it opts in.
"""
