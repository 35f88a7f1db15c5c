"""The options of a run ddptui starts: their parser, the run's configuration, the checks that
refuse bad input with one line, shared by the dashboard and the built-in loop's ranks.
"""
