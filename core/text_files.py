"""Opening the text files users hand us (traces, length tables, profiles, model configs):
gzip-compressed files are read transparently, other binary content is refused with an error
that names the file instead of a bare codec message."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import TextIO

GZIP_MAGIC = b"\x1f\x8b"
_SNIFF_BYTES = 8192


def is_gzip(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.read(2) == GZIP_MAGIC


def _check_text(path: Path, head: bytes, what: str) -> None:
    """Refuse content that is plainly binary: a NUL byte or bytes that are not UTF-8."""
    if b"\0" in head:
        raise ValueError(f"{path}: {what} is a binary file (NUL byte at offset {head.index(0)})")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as error:
        if error.start < len(head) - 3:  # not merely a character cut at the sniff boundary
            raise ValueError(binary_message(path, what, error)) from None


def binary_message(path: Path, what: str, error: UnicodeDecodeError) -> str:
    """The error for a file that stopped decoding as UTF-8 part-way through."""
    byte = error.object[error.start : error.start + 1].hex()
    return (
        f"{path}: {what} is not UTF-8 text (byte 0x{byte} at offset {error.start}): "
        "a binary file? (gzip files are read directly)"
    )


def open_text(path: Path, what: str, newline: str | None = None) -> TextIO:
    """``path`` opened for reading text (UTF-8, a BOM dropped), decompressing gzip."""
    if is_gzip(path):
        try:
            with gzip.open(path, "rb") as raw:
                head = raw.read(_SNIFF_BYTES)
        except (OSError, EOFError) as error:
            raise ValueError(f"{path}: {what} is a broken gzip file ({error})") from None
        _check_text(path, head, what)
        return gzip.open(path, "rt", encoding="utf-8-sig", newline=newline)
    with path.open("rb") as handle:
        _check_text(path, handle.read(_SNIFF_BYTES), what)
    return path.open(encoding="utf-8-sig", newline=newline)


def read_text(path: Path, what: str) -> str:
    """The whole text of ``path`` (see ``open_text``); errors name the file and ``what``."""
    with open_text(path, what) as handle:
        try:
            return handle.read()
        except UnicodeDecodeError as error:
            raise ValueError(binary_message(path, what, error)) from None


def trace_stem(path: Path) -> str:
    """The file's name without its suffix, and without ``.gz`` first (``a.csv.gz`` -> ``a``)."""
    return Path(path.stem).stem if path.suffix == ".gz" else path.stem
