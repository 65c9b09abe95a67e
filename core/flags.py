"""Command-line flags generated from the settings table (`core.config.SETTINGS`): one flag per
setting, named after its field (``--max-num-batched-tokens``, as vLLM names them), its earlier
spellings kept as aliases (``--max-batch-tokens``), its help and default from the table and
the config class, its value refused by the setting's own check. Every command line that takes
serving settings (``python -m sim run``, ``python -m engine run``, ``validate``...) adds them
here, so each means the same everywhere."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from core.config import SETTING_NAMES, SETTINGS_BY_FIELD, Check, Setting, setting_fields
from core.policies import POLICIES

# What a flag's default looks like in --help when the config leaves it None and the table does
# not say what None means.
_NOT_SET = "not set"


def checked_type(parse: Callable[[str], Any], check: Check) -> Callable[[str], Any]:
    """An argparse ``type``: the text read by ``parse`` (``int``, ``float``), then refused if
    ``check`` finds a problem; argparse prints ``error: argument --flag: <problem>``."""
    kind = "an integer" if parse is int else "a number"

    def read(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None
        problem = check(value)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return value

    return read


def _help(row: Setting, default: Any, extra: str) -> str:
    if row.type is bool:
        shown = "on" if default else "off"
    elif default is None:
        shown = row.none_means or _NOT_SET
    else:
        shown = str(default)
    text = f"{row.help}{extra} (default: {shown})"
    return text.replace("%", "%%")  # argparse formats help with %


def add_setting_flags(
    parser: argparse._ActionsContainer,
    config_classes: Sequence[type],
    skip: Sequence[str] = (),
    only: Sequence[str] | None = None,
    choices: Mapping[str, Sequence[str]] | None = None,
    help_extra: Mapping[str, str] | None = None,
) -> list[str]:
    """A flag for each setting of ``config_classes`` (the core's configs) but those in
    ``skip`` (or, given ``only``, for those alone); ``choices`` replaces a row's choices
    (``policy``'s are `POLICIES`), ``help_extra`` adds to a row's help. Each flag's argparse
    default is None, meaning "not given": the config's own default applies
    (`given_settings`), and --help shows it. Returns the fields given flags."""
    unknown = set(skip) | set(only or ()) | set(choices or {}) | set(help_extra or {})
    added: list[str] = []
    for config_class in config_classes:
        defaults = config_class()
        for name in setting_fields(config_class):
            unknown.discard(name)
            if name in skip or (only is not None and name not in only):
                continue
            row = SETTINGS_BY_FIELD[name]
            _add(parser, row, getattr(defaults, name), choices, help_extra)
            added.append(name)
    if unknown:
        raise ValueError(f"no such setting: {sorted(unknown)}")
    return added


def _add(
    parser: argparse._ActionsContainer,
    row: Setting,
    default: Any,
    choices: Mapping[str, Sequence[str]] | None,
    help_extra: Mapping[str, str] | None,
) -> None:
    names = [row.flag, *row.old_flags]
    help = _help(row, default, (help_extra or {}).get(row.field, ""))
    if row.type is bool:
        # ``--no-X`` too, as vLLM's flags: it turns off what a recorded run (``measured
        # validate``) or a sweep's base had on.
        parser.add_argument(*names, action=argparse.BooleanOptionalAction, default=None, help=help)
        return
    allowed = (choices or {}).get(row.field, row.choices)
    if allowed is None and row.field == "policy":
        allowed = tuple(POLICIES)
    if allowed is not None:
        parser.add_argument(*names, choices=tuple(allowed), default=None, help=help)
        return
    metavar = "N" if row.type is int else "X"
    reader = checked_type(row.type, row.problem)
    parser.add_argument(*names, type=reader, default=None, metavar=metavar, help=help)


def given_settings(
    args: argparse.Namespace, names: Sequence[str] = SETTING_NAMES
) -> dict[str, Any]:
    """The settings among ``names`` (the core's) that the command line gave, by field name."""
    given: dict[str, Any] = {}
    for name in names:
        value = getattr(args, name, None)
        if value is not None:
            given[name] = value
    return given


# The settings some policy reads and others do not (`Policy.reads`).
_POLICY_SETTINGS = frozenset().union(*(cls.reads for cls in POLICIES.values()))


def _batching(policies: Sequence[str]) -> str:
    """``static and dynamic batching``: the policies that read a setting, as the help says."""
    return " and ".join(policies) + " batching"


def unused_settings(given: Mapping[str, Any], policy: str, preemption_mode: str) -> list[str]:
    """The settings ``given`` (by field name) that a run of ``policy`` never reads, each as
    ``--flag: why``: for a command to say so rather than run as if they had been heard. The
    two budgets are never among them: under static batching they still size the KV cache, as
    vLLM's profile run does."""
    unused = []
    for name in sorted(set(given) & _POLICY_SETTINGS):
        if name not in POLICIES[policy].reads:
            readers = [p for p, cls in POLICIES.items() if name in cls.reads]
            unused.append(
                f"{SETTINGS_BY_FIELD[name].flag}: applies to {_batching(readers)}, not {policy}"
            )
    if "swap_space_gib" in given and preemption_mode != "swap":
        unused.append("--swap-space-gib: preemption recomputes (--preemption-mode swap swaps)")
    return unused
