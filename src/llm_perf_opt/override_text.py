"""What one Hydra command-line override says (`key=value`, `+key=value`, `++key=value`, `~key`, `group@pkg=option`),
read as text without composing a config: the one place the commands split an override into its key and value, and
write one (`override`: a value quoted so Hydra reads it back as it is)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

ADD_PREFIXES = "+~"  # `+`/`++` add a key, `~` deletes one


def override_key(override: str) -> str:
    """The config key or group an override sets: prefixes and a group's package (`@pkg`) dropped."""
    return override.split("=", 1)[0].lstrip(ADD_PREFIXES).split("@", 1)[0]


def override_value(override: str) -> str | None:
    """The value an override gives (as written); None for a deletion without one (`~key`)."""
    _, sep, value = override.partition("=")
    return value if sep else None


def deletes(override: str) -> bool:
    """Whether the override deletes its key (`~key` or `~key=value`)."""
    return override.startswith("~")


def sets_key(overrides: Iterable[str], key: str) -> bool:
    """Whether one of the overrides sets (or adds, or deletes) `key`."""
    return any(override_key(o) == key for o in overrides)


_PLAIN_PATH = re.compile(r"[A-Za-z0-9_.@+-]*/[A-Za-z0-9_./@+-]*")  # ASCII, a slash, nothing Hydra's grammar reads


def quoted(value: str | Path) -> str:
    """`value` as Hydra's override grammar reads it back unchanged, whatever it holds: a plain ASCII path bare, anything
    else (a space, a non-ASCII letter, `,`, `=`, a quote) in single quotes, a quote and the backslashes before it, or
    before the closing quote, escaped."""
    if _PLAIN_PATH.fullmatch(str(value)):  # a plain path reads back as it is: left bare, as a user would type it
        return str(value)
    text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", str(value))
    text = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text)
    return f"'{text}'"


def quoted_override(key: str, value: str | Path) -> str:
    """The override `key=<value>` with `value` quoted (`quoted`): how a command passes a path to a child command."""
    return f"{key}={quoted(value)}"
