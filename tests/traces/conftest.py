"""Shared fixtures for trace tests: the real traces in ../shared/traces and, per loader format,
a way to write small handmade files whose rows can be made bad on purpose.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pytest

SHARED_TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"


@pytest.fixture
def shared_traces() -> Path:
    """The real-trace folder; tests using it skip when it is absent."""
    if not (SHARED_TRACES / "README.md").is_file():
        pytest.skip(f"real traces not found at {SHARED_TRACES}")
    return SHARED_TRACES


Cells = tuple[str, str, str]  # raw (time, prompt, output) text as it will appear in the file


@dataclass(frozen=True)
class FormatCase:
    """How to write one format: its header, how a row looks and which fields hold what."""

    name: str
    header: str | None  # None: JSON Lines, no header
    row: Callable[[Cells], str]
    time: Callable[[float], str]  # seconds since the first row -> the format's time text
    time_field: str
    prompt_field: str
    output_field: str
    newline: str = "\n"
    final_newline: bool = True
    text: Callable[[str], str] = lambda value: value  # quote a non-numeric value if needed

    @property
    def first_data_line(self) -> int:
        return 2 if self.header is not None else 1

    def good(self, t_s: float, prompt: int = 100, output: int = 20) -> Cells:
        return (self.time(t_s), str(prompt), str(output))

    def write(self, path: Path, rows: list[Cells], header: str | None = None) -> Path:
        lines = [header or self.header] if self.header is not None else []
        lines += [self.row(cells) for cells in rows]
        text = self.newline.join(str(line) for line in lines)
        path.write_bytes((text + (self.newline if self.final_newline else "")).encode())
        return path


_AZURE_START = datetime(2023, 11, 16, 18, 17, 3, 979960)


def _azure_time(t_s: float) -> str:
    # Seven fractional digits, like the real file.
    return (_AZURE_START + timedelta(seconds=t_s)).strftime("%Y-%m-%d %H:%M:%S.%f") + "0"


def _mooncake_row(cells: Cells) -> str:
    time, prompt, output = cells
    blocks = max(1, -(-int(prompt) // 512)) if prompt.lstrip("-").isdigit() else 1
    return (
        f'{{"timestamp": {time}, "input_length": {prompt}, "output_length": {output},'
        f' "hash_ids": {json.dumps(list(range(blocks)))}}}'
    )


FORMAT_CASES: dict[str, FormatCase] = {
    "servesim": FormatCase(
        "servesim",
        "arrival_s,prompt_tokens,output_tokens,num_samples",
        lambda c: f"{c[0]},{c[1]},{c[2]},1",
        repr,
        "arrival_s",
        "prompt_tokens",
        "output_tokens",
    ),
    "vidur": FormatCase(
        "vidur",
        "arrived_at,num_prefill_tokens,num_decode_tokens",
        ",".join,
        repr,
        "arrived_at",
        "num_prefill_tokens",
        "num_decode_tokens",
    ),
    "azure": FormatCase(
        "azure",
        "TIMESTAMP,ContextTokens,GeneratedTokens",
        ",".join,
        _azure_time,
        "TIMESTAMP",
        "ContextTokens",
        "GeneratedTokens",
        newline="\r\n",
        final_newline=False,  # like the real Azure file
    ),
    "mooncake": FormatCase(
        "mooncake",
        None,
        _mooncake_row,
        lambda t_s: str(round(t_s * 1000)),
        "timestamp",
        "input_length",
        "output_length",
        text=json.dumps,
    ),
    "burstgpt": FormatCase(
        "burstgpt",
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
        lambda c: f"{c[0]},ChatGPT,{c[1]},{c[2]},0,Conversation log",
        repr,
        "Timestamp",
        "Request tokens",
        "Response tokens",
    ),
}


@pytest.fixture(params=sorted(FORMAT_CASES))
def case(request: pytest.FixtureRequest) -> FormatCase:
    """Each loader format in turn."""
    return FORMAT_CASES[request.param]
