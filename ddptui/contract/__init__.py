"""The floor every process of a run stands on, and the only code more than one of them loads:
the events and orders (schema, codec, channel, socket/), the run model (state/), the options (options/),
what a rank's output says (observe/), the runtime folder (runs/), GPU readings. It imports no side."""
