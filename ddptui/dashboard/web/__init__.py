"""`ddptui web`: a run's dashboard in browser tabs, each tab its own `ddptui attach` process.

Loaded in the `ddptui web` process (textual-serve and aiohttp: the `web` extra); tab_process.py
in a tab's too.
"""
