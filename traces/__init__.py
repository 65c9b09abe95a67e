"""Request traces: the in-memory schema, loaders for public formats, seeded generators.

Importing `traces` loads only the stdlib-only modules re-exported here; the numpy-based
generators live in `traces.generators` and `traces.distributions`.
"""

from traces.loaders import FORMATS, detect_format, load_length_table, load_trace
from traces.problems import TraceFormatError, TraceProblem
from traces.schema import LengthTable, Trace, TraceRequest
from traces.writer import write_trace

__all__ = [
    "FORMATS",
    "LengthTable",
    "Trace",
    "TraceFormatError",
    "TraceProblem",
    "TraceRequest",
    "detect_format",
    "load_length_table",
    "load_trace",
    "write_trace",
]
