"""Unknown override keys: one paragraph naming the nearest valid key, before Hydra starts.

Hydra answers an override of a key the config lacks (`run.repets=3`) with a hint to add `+`, which would make the
key exist and be silently ignored. :func:`check_override_keys` composes the config with the command line's
overrides first (once per combination of swept config groups, since a group choice changes which keys exist) and
raises a :class:`UserError` that names the nearest valid key instead. Everything else is left to Hydra.
"""

from __future__ import annotations

import difflib
import itertools
import re
from collections.abc import Iterator, Sequence
from importlib.resources import files
from typing import Any

from hydra.errors import ConfigCompositionException, HydraException
from omegaconf import DictConfig, OmegaConf

from llm_perf_opt.errors import UserError

_UNKNOWN = re.compile(r"Could not override '([^']+)'")
_MAX_COMBINATIONS = 32  # group combinations composed at most (each takes a fraction of a second)


def check_override_keys(config_name: str, argv: Sequence[str], *, command: str) -> None:
    """UserError when an override in `argv` (a console script's arguments) sets a key the config lacks."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args, _ = get_args_parser().parse_known_args(list(argv))
    if args.help or args.hydra_help or args.info or args.shell_completion or args.config_dir or args.config_path:
        return
    try:
        parsed = OverridesParser.create().parse_overrides(list(args.overrides))
        combinations = list(itertools.islice(_combinations(parsed), _MAX_COMBINATIONS))
    except (HydraException, ValueError):  # a syntax Hydra reports itself, or a sweep that cannot be enumerated
        return
    for overrides in combinations:
        unknown, keys = _unknown_keys(args.config_name or config_name, overrides)
        if unknown:
            raise _error(unknown, keys, overrides, command)


def is_group(key: str) -> bool:
    """A config group (`model`, `pipeline/torch_profiler`, `hydra/launcher`) rather than a config key."""
    return "/" in key or (files("llm_perf_opt") / "conf" / key).is_dir()


def _combinations(parsed: Sequence[Any]) -> Iterator[list[str]]:
    """Single-valued override lists: every combination of swept groups, the first value of other sweeps."""
    options: list[list[str]] = []
    for override in parsed:
        if not override.is_sweep_override():
            options.append([override.input_line])
            continue
        if not override.is_discrete_sweep() or override.value_type.name == "GLOB_CHOICE_SWEEP":
            raise ValueError(f"{override.input_line}: not enumerable here")
        values = list(override.sweep_string_iterator())
        key = override.get_key_element()
        chosen = values if is_group(override.key_or_group) else values[:1]
        options.append([f"{key}={value}" for value in chosen])
    for combination in itertools.product(*options):
        yield list(combination)


def _unknown_keys(config_name: str, overrides: Sequence[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """The (key, override) pairs whose key the config lacks, and the config's keys without them."""
    from llm_perf_opt.config_compose import compose_config

    remaining = list(overrides)
    unknown: list[tuple[str, str]] = []
    for _ in range(len(overrides) + 1):
        try:
            cfg = compose_config(config_name, *remaining, return_hydra_config=True)
        except ConfigCompositionException as exc:
            match = _UNKNOWN.search(str(exc))
            culprit = next((o for o in remaining if match and _key_of(o) == match.group(1)), None)
            if culprit is None:
                return unknown, []  # another composition error: Hydra reports it
            unknown.append((_key_of(culprit), culprit))
            remaining.remove(culprit)
            continue
        return unknown, _flat_keys(cfg)
    return unknown, []


def _key_of(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~").split("@", 1)[0]


def _flat_keys(cfg: DictConfig) -> list[str]:
    """Every dotted key path of `cfg` (containers and leaves; list items not descended)."""
    out: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for name, value in node.items():
                path = f"{prefix}{name}"
                out.append(path)
                walk(value, f"{path}.")

    walk(OmegaConf.to_container(cfg, resolve=False), "")
    return out


def _nearest(key: str, keys: Sequence[str]) -> str | None:
    pool = [k for k in keys if k.startswith("hydra.") == key.startswith("hydra.")]
    leaf = key.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(key, pool, n=1, cutoff=0.6) or difflib.get_close_matches(
        leaf, [k.rsplit(".", 1)[-1] for k in pool], n=1, cutoff=0.75
    )
    if not close:
        return None
    if close[0] in pool:
        return close[0]
    return next(k for k in pool if k.rsplit(".", 1)[-1] == close[0])


def _error(
    unknown: Sequence[tuple[str, str]], keys: Sequence[str], overrides: Sequence[str], command: str
) -> UserError:
    groups = [o for o in overrides if is_group(_key_of(o)) and not o.startswith(("hydra", "+", "~"))]
    where = f" with {' '.join(groups)}" if groups else ""
    names = " and ".join(key for key, _ in unknown)
    verb = "is not a setting" if len(unknown) == 1 else "are not settings"
    fixes = []
    for key, override in unknown:
        nearest = _nearest(key, keys)
        value = override.split("=", 1)[1] if "=" in override else ""
        fixes.append(
            f"use {nearest}={value} (the nearest setting to {key})" if nearest else f"check the spelling of {key}"
        )
    return UserError(
        f"{names} {verb} of {command}{where}", f"{'; '.join(fixes)}; `{command} --cfg job` lists every setting"
    )
