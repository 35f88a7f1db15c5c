"""The run's model: the state folded from events (runstate), what the screens show of a rank and
a device (views), the epochs table, the charts' series, and the RunSource every kind of run serves.

The run's owners (supervisor, script run, attach, replay) write to it; view/ only reads it.
"""
