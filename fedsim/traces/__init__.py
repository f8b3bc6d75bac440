"""Availability traces: the file format, the index the engine queries, and generators.

The names load on first use (PEP 562): ``fedsim trace --help`` needs the generator list but
not pyarrow, and ``import fedsim.traces.X`` runs this file first.
"""

from fedsim import lazy_exports

__all__ = ["GENERATORS", "AvailabilityIndex", "Trace", "generate", "known_probability",
           "read_trace", "write_trace"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "GENERATORS": "fedsim.traces.generators",
    "generate": "fedsim.traces.generators",
    "known_probability": "fedsim.traces.generators",
    "AvailabilityIndex": "fedsim.traces.index",
    "read_trace": "fedsim.traces.io",
    "write_trace": "fedsim.traces.io",
    "Trace": "fedsim.traces.schema",
})
