"""The header fields every handmade tiny-llama CPU profile in these tests shares."""

from __future__ import annotations

from typing import Any


def cpu_profile_header(format_version: int) -> dict[str, Any]:
    """``format_version``, device, software, command, model, TP and block size of a tiny-llama
    profile calibrated on CPU: a test adds its ops, rules and steps."""
    return {
        "format_version": format_version,
        "device": {"name": "cpu (x86_64)", "driver": "none"},
        "software": {"torch": "2.13.0", "triton": "3.7.1", "cuda": "none"},
        "command": "python -m sim calibrate --model tiny-llama --device cpu --out p.json",
        "model": "tiny-llama",
        "tp": 1,
        "block_size": 16,
    }
