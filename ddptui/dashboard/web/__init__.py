"""`ddptui web`: a run's dashboard in browser tabs, each tab its own `ddptui attach` process.

Loaded only in the `ddptui web` process (textual-serve and aiohttp: the `web` extra).
"""
