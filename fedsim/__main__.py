"""`python -m fedsim`: from its first line on, while the command is still being imported too, a
stop signal ends it with 130 / 143 and one line."""

import signal

from fedsim.errors import STOP_SIGNALS, Stopped, raise_stopped

for sig in STOP_SIGNALS:
    signal.signal(sig, raise_stopped)
try:
    from fedsim.cli import entry
except Stopped as stop:
    import os
    import sys

    print(f"stopped by {stop.name}", file=sys.stderr)
    os._exit(stop.exit_code)
entry()
