"""Telemetry out of a rank: the reporter and its step meter, the heartbeat, the link to `ddptui
attach`, the device sampler of unsupervised ranks, and TensorBoard."""
