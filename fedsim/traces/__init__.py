"""Availability traces: the file format, the index the engine queries, and generators."""

from fedsim.traces.generators import GENERATORS, generate, known_probability
from fedsim.traces.index import AvailabilityIndex
from fedsim.traces.io import read_trace, write_trace
from fedsim.traces.schema import Trace

__all__ = ["GENERATORS", "AvailabilityIndex", "Trace", "generate", "known_probability",
           "read_trace", "write_trace"]
