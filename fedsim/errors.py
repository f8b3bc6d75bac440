"""The one exception type that reaches the user as a single line (no traceback), and the one
"did you mean" helper of its messages."""

import difflib


class FedsimError(Exception):
    """A user mistake or bad input: the message says what, where, and how to fix it.

    The CLI prints ``error: <message>`` and exits with status 2; everything else that
    escapes is a bug and keeps its traceback.
    """


def did_you_mean(word, valid, end: str = "?") -> str:
    """``"did you mean 'x'" + end`` for the valid name closest to `word`; "" if none is close."""
    close = difflib.get_close_matches(str(word), [str(v) for v in valid], n=1, cutoff=0.5)
    return f"did you mean '{close[0]}'{end}" if close else ""


def choice_error(where: str, value, valid, problem: str = "is unknown") -> FedsimError:
    """The error for a value outside `valid`: the closest valid one, if any, then all of them."""
    hint = did_you_mean(value, valid)
    return FedsimError(f"{where} = {value!r} {problem}{'; ' + hint if hint else ''} "
                       f"(one of: {', '.join(valid)})")
