"""The dashboard's screens over the main one: the GPUs, help, a rank's stacks, the confirmations.
Each draws from a run-state view and asks nothing of the run itself."""
