"""The run's process for the built-in loop: the supervisor thread, the rank processes, the watchdog and
the health of ranks, autotuning, the bytecode cache, the run's own policy options."""
