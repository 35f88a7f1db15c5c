"""The two kinds of error that end a run with exit code 2 and one line for the user: bad input
on the command line, and data the user must fix.
"""


class UsageError(Exception):
    """Bad input from the user: reported as one line on stderr, exit code 2."""


class DataError(Exception):
    """A data problem the user must fix (corrupt image, bad dataset function); exit code 2."""
