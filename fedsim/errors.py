"""The exceptions that reach the user as a single line (no traceback): FedsimError, a user
mistake (exit 2), and Stopped, a stop signal (exit 130 / 143); the "did you mean" helper of
their messages."""

import difflib
import signal
import sys
import threading
from contextlib import contextmanager


class FedsimError(Exception):
    """A user mistake or bad input: the message says what, where, and how to fix it.

    The CLI prints ``error: <message>`` and exits with status 2; everything else that
    escapes is a bug and keeps its traceback.
    """


def first_line(err: BaseException) -> str:
    """An exception's message as one line of an error (its first line; its type if it has none)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def did_you_mean(word, valid, end: str = "?") -> str:
    """``"did you mean 'x'" + end`` for the valid name closest to `word` (the same name in other
    letter case first: `MLP` for `mlp`); "" if none is close."""
    same = {str(v).lower(): str(v) for v in valid}.get(str(word).lower())
    close = [same] if same is not None else difflib.get_close_matches(str(word), [str(v) for v in valid], n=1,
                                                                       cutoff=0.5)
    return f"did you mean '{close[0]}'{end}" if close else ""


def choice_error(where: str, value, valid, problem: str = "is unknown") -> FedsimError:
    """The error for a value outside `valid`: the closest valid one, if any, then all of them."""
    hint = did_you_mean(value, valid)
    return FedsimError(f"{where} = {value!r} {problem}{'; ' + hint if hint else ''} "
                       f"(one of: {', '.join(valid)})")


STOP_SIGNALS = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}
EXIT_CODES = {"Ctrl-C": 130, "SIGTERM": 143}  # 128 + the signal's number, as a shell reports it


class Stopped(BaseException):
    """A stop signal that ends the command at once: while it sets up (imports, data, the
    trace), where there is nothing to finish or save, or a second signal during a run's rounds
    (fedsim/sim/engine.py). A BaseException, as KeyboardInterrupt is, so that no `except
    Exception` takes it for a failure. `hint` ends the line the CLI prints (`stopped by
    Ctrl-C` + hint): what the command left, and how to go on."""

    def __init__(self, name: str, hint: str = ""):
        super().__init__(name)
        self.name, self.hint = name, hint

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.name]


def raise_stopped(signum, frame):
    """Raise Stopped; but a first signal that arrives inside an import is held until the import
    returns: torch's import runs C++ that checks for signals, and an exception raised there aborts
    the process ("terminate called after throwing ... error_already_set", exit -6). A second
    signal while one is held raises at once (a user's module may take long to import)."""
    outermost = _outermost_import(frame)
    if _held or outermost is None:
        _held.clear()
        raise Stopped(STOP_SIGNALS[signum])
    _held.append(signum)

    def raise_in_the_importer(frame, event, arg):
        sys.setprofile(None)
        if _held:  # (not raised by a second signal meanwhile)
            raise Stopped(STOP_SIGNALS[_held.pop()])

    def on_return(returning, event, arg):
        if event == "return" and returning is outermost:
            sys.setprofile(raise_in_the_importer)  # at its next event, in the code that imported

    sys.setprofile(on_return)  # (the main thread's profiler: handlers run there)


_held: list[int] = []  # the stop signal held while the main thread imports (one at most)


def _outermost_import(frame):
    """The frame of importlib's that started the import running in `frame`; None outside one."""
    found = None
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            found = frame
        frame = frame.f_back
    return found


def say_stopping(line: str) -> None:
    """The line a first stop signal prints (what the command waits for), on stderr, off a
    progress bar: on a terminal, or a run's bar drawn into a log file (tqdm's live bars)."""
    bars = getattr(getattr(sys.modules.get("tqdm"), "tqdm", None), "_instances", ())
    fresh_line = "\n" if sys.stderr.isatty() or len(bars) else ""
    print(f"{fresh_line}{line}", file=sys.stderr, flush=True)


@contextmanager
def on_stop_signals(handler):
    """Within: `handler(signum, frame)` handles Ctrl-C and SIGTERM, whatever the process
    inherited (a job that a script starts with `&` ignores SIGINT, and Python then never raises
    KeyboardInterrupt); yields the handlers it replaced, {} outside the main thread, where
    signals cannot be handled and nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield {}
        return
    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield previous
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def stop_at_once():
    """Within: Ctrl-C and SIGTERM raise Stopped (outside a run's rounds: nothing to finish)."""
    return on_stop_signals(raise_stopped)
