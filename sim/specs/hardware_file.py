"""Hardware from a file: a JSON or TOML table of `HardwareSpec` fields (SI units), optionally
over a named preset (`base`). The schema is documented in docs/hardware_format.md."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

from sim.specs.hardware import HardwareSpec, get_hardware_preset

HARDWARE_FILE_SUFFIXES = (".json", ".toml")
_BASE_KEY = "base"


def _field_kinds() -> dict[str, str]:
    """Each HardwareSpec field and its kind: 'str', 'int', 'float', or 'float?' (may be None).

    Read from the dataclass, so fields added to HardwareSpec are accepted in files at once.
    """
    kinds = {}
    for field in dataclasses.fields(HardwareSpec):
        annotation = str(field.type).replace(" ", "")
        optional = annotation.endswith("|None") or annotation.startswith("None|")
        base = annotation.replace("|None", "").replace("None|", "")
        kinds[field.name] = base + ("?" if optional else "")
    return kinds


def _line_of(text: str, key: str) -> str:
    """' (line N)' for the first line that sets `key`, or '' when it cannot be found."""
    pattern = re.compile(rf'^\s*"?{re.escape(key)}"?\s*[:=]')
    for number, line in enumerate(text.splitlines(), start=1):
        if pattern.search(line) or f'"{key}"' in line:
            return f" (line {number})"
    return ""


def _convert(kind: str, value: Any) -> Any:
    """`value` as the field's type, or raise TypeError with what was expected."""
    if kind.endswith("?"):
        if value is None:
            return None
        kind = kind[:-1]
    if kind == "str":
        if not isinstance(value, str):
            raise TypeError("a string")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("an integer" if kind == "int" else "a number")
    if not math.isfinite(value):
        raise TypeError("a finite number")
    if kind == "int":
        if isinstance(value, float) and not value.is_integer():
            raise TypeError("an integer")
        return int(value)
    return float(value)


def _parse(path: Path, text: str) -> dict[str, Any]:
    if path.suffix == ".toml":
        try:
            import tomllib
        except ModuleNotFoundError as error:  # Python 3.10
            raise ValueError(f"{path}: reading TOML needs Python 3.11+; use JSON") from error
        try:
            table: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"{path}: not valid TOML ({error})") from error
    else:
        try:
            table = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not valid JSON ({error})") from error
    if not isinstance(table, dict):
        raise ValueError(f"{path}: expected a table of HardwareSpec fields at the top level")
    return table


def load_hardware_file(path: str | Path) -> HardwareSpec:
    """Read a hardware file; every error names the file, the key and (where found) its line."""
    path = Path(path)
    if path.suffix not in HARDWARE_FILE_SUFFIXES:
        raise ValueError(f"{path}: a hardware file must end in .json or .toml")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: cannot read the hardware file ({error})") from error
    table = _parse(path, text)
    kinds = _field_kinds()
    values: dict[str, Any] = {}
    if _BASE_KEY in table:
        base = table.pop(_BASE_KEY)
        if not isinstance(base, str):
            raise ValueError(f"{path}{_line_of(text, _BASE_KEY)}: base must be a preset name")
        try:
            values = {f: getattr(get_hardware_preset(base), f) for f in kinds}
        except ValueError as error:
            raise ValueError(f"{path}{_line_of(text, _BASE_KEY)}: {error}") from error
    for key, value in table.items():
        if key not in kinds:
            raise ValueError(
                f"{path}{_line_of(text, key)}: unknown key {key!r}; the keys are 'base' and "
                f"the HardwareSpec fields: {', '.join(kinds)}"
            )
        try:
            values[key] = _convert(kinds[key], value)
        except TypeError as expected:
            raise ValueError(
                f"{path}{_line_of(text, key)}: HardwareSpec.{key} must be {expected}, got {value!r}"
            ) from None
    defaults = {
        f.name
        for f in dataclasses.fields(HardwareSpec)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }
    for name, kind in kinds.items():
        if name not in values and kind.endswith("?"):
            values[name] = None
    missing = [name for name in kinds if name not in values and name not in defaults]
    if missing:
        raise ValueError(
            f"{path}: missing key(s) {', '.join(missing)} (HardwareSpec fields); give them or "
            "name a preset to start from with 'base'"
        )
    try:
        return HardwareSpec(**values)
    except ValueError as error:
        field = re.search(r"HardwareSpec\.(\w+)", str(error))
        line = _line_of(text, field.group(1)) if field else ""
        raise ValueError(f"{path}{line}: {error}") from error


def hardware_is_file(name_or_path: str) -> bool:
    """Whether ``--hardware`` names a hardware file rather than a preset."""
    return name_or_path.endswith(HARDWARE_FILE_SUFFIXES)


def load_hardware(name_or_path: str) -> HardwareSpec:
    """A hardware file (a name ending in .json or .toml) or a preset name."""
    if hardware_is_file(name_or_path):
        return load_hardware_file(name_or_path)
    return get_hardware_preset(name_or_path)
