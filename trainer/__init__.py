"""trainer: what runs inside one DDP rank; complete on its own and runnable under torchrun.

`torchrun --standalone --nproc-per-node 2 -m ddptui_trainer resnet18` trains; ddptui starts the same code.
"""
