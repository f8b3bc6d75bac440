"""The one exception type that reaches the user as a single line (no traceback)."""

import difflib


class FedsimError(Exception):
    """A user mistake or bad input: the message says what, where, and how to fix it.

    The CLI prints ``error: <message>`` and exits with status 2; everything else that
    escapes is a bug and keeps its traceback.
    """


def choice_error(where: str, value, valid, problem: str = "is unknown") -> FedsimError:
    """The error for a value outside `valid`: the closest valid one, if any, then all of them."""
    close = difflib.get_close_matches(str(value), list(valid), n=1, cutoff=0.5)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return FedsimError(f"{where} = {value!r} {problem}{hint} (one of: {', '.join(valid)})")
