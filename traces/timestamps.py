"""Exact parsing of date-time strings such as Azure's `2023-11-16 18:17:03.9799600` to integer
nanoseconds since the Unix epoch (naive times are taken as UTC).
"""

from __future__ import annotations

import re
from datetime import date

_DATETIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"\s*(Z|[+-]\d{2}:?\d{2})?"
)
_UNIX_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_NS_PER_S = 1_000_000_000


def parse_timestamp_ns(text: str, day_cache: dict[str, int] | None = None) -> int:
    """Nanoseconds since 1970-01-01T00:00 UTC; raises ValueError on anything malformed.

    Accepts 0-9 fractional digits (Azure 2023 has 7; Azure 2024 mixes 0 and 6 plus `+00:00`).
    `day_cache` memoises the date part, which repeats on almost every row.
    """
    match = _DATETIME.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"not a date-time like 'YYYY-MM-DD HH:MM:SS.fffffff': {text!r}")
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    date_key = f"{year}-{month}-{day}"
    days = day_cache.get(date_key) if day_cache is not None else None
    if days is None:
        days = date(int(year), int(month), int(day)).toordinal() - _UNIX_EPOCH_ORDINAL
        if day_cache is not None:
            day_cache[date_key] = days
    hours, minutes, seconds = int(hour), int(minute), int(second)
    if hours > 23 or minutes > 59 or seconds > 59:
        raise ValueError(f"time of day out of range: {text!r}")
    total_s = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        total_s -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    fraction_ns = int(fraction.ljust(9, "0")) if fraction else 0
    return total_s * _NS_PER_S + fraction_ns
