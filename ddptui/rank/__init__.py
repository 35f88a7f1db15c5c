"""Loaded inside a rank, and nowhere else: the kit every kind of rank runs on (telemetry/, elastic/,
prefetch, sampler, compat), your script's api/, the injected start-up, the wrapper, the callbacks."""
