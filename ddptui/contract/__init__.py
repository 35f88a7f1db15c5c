"""The contract between a rank and whoever watches it: the telemetry event schema and the
authenticated channel to `ddptui attach`. Both sides import it; it imports neither."""
