"""The one exception type that reaches the user as a single line (no traceback)."""


class FedsimError(Exception):
    """A user mistake or bad input: the message says what, where, and how to fix it.

    The CLI prints ``error: <message>`` and exits with status 2; everything else that
    escapes is a bug and keeps its traceback.
    """
