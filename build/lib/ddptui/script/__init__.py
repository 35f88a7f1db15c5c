"""Your own training script under ddptui: launched as torchrun would launch it, watched from
outside (processes, output, GPUs, stacks), and steered through `ddptui.init()` where it opts in.
"""
