"""Unknown override keys and config-group options: one paragraph naming the nearest valid one, before Hydra starts.

Hydra answers an override of a key the config lacks (`run.repets=3`) with a hint to add `+`, which would make the
key exist and be silently ignored. :func:`check_override_keys` composes the config first (once per combination of
swept config groups, which change the keys) and raises a :class:`UserError` naming the nearest valid key instead; so
does a `+key` (or `++key`) inside one of the config's sections (`+run.repeatz=3`), where nothing reads it (`+` may
add a top-level key of your own, `+my.note=...`, or an entry of an OPEN_MAPS map), and a config-group option that
does not exist (`model=nosuch`, listing the options). Everything else is left to Hydra.
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import re
from collections.abc import Callable, Iterator, Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any, NamedTuple

from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf

from llm_perf_opt.errors import UserError
from llm_perf_opt.override_text import override_key

_UNKNOWN = re.compile(r"Could not override '([^']+)'")
_MAX_COMBINATIONS = 32  # group combinations composed at most (each takes a fraction of a second)
# Config nodes whose entries are the user's to name, so `+` may add one (each is validated where it is read).
OPEN_MAPS = ("whatif.levers", "runtime.compile_options")


def check_override_keys(
    config_name: str, argv: Sequence[str], *, command: str, check: Callable[[DictConfig], None] | None = None
) -> None:
    """UserError when an override in `argv` (a console script's arguments) cannot be parsed, sets a key the config
    lacks, adds one inside a section of the config, or picks a config-group option that does not exist; then
    `check` (default: every setting's type, `settings_schema.check_config`) on each composed combination."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    from llm_perf_opt.settings_schema import check_config

    args, _ = _ARGS.parse_known_args(list(argv))
    if args.help or args.hydra_help or args.info or args.shell_completion or args.config_path or args.version:
        return
    search = _search_path(args.config_dir, args.overrides)
    if search is None:
        return
    setup = _Setup(args.config_name or config_name, command, args.config_dir, search)
    try:
        parsed = OverridesParser.create().parse_overrides(list(args.overrides))
    except OverrideParseException:
        raise _grammar_error(args.overrides, command) from None
    _check_values(parsed)
    try:
        combinations = list(itertools.islice(_combinations(parsed, args.config_dir), _MAX_COMBINATIONS))
    except (HydraException, ValueError):  # a sweep that cannot be enumerated here
        return
    for overrides in combinations:
        unknown, keys, composed = _unknown_keys(setup, overrides)
        if unknown:
            raise _error(unknown, keys, overrides, command)
        cfg = composed if composed is not None else _composed(setup, overrides)
        if cfg is not None:
            (check or check_config)(cfg)


def _check_values(parsed: Sequence[Any]) -> None:
    """Each override of a typed setting (`settings_schema.SCHEMA`), every value of a sweep over it included: a bad
    one is a UserError naming it here, since composing would end in the typed schema's traceback
    (`config_schema`: `run.batch_size=abc` is no int). An interpolation is left to the composed config's check."""
    from llm_perf_opt.config_schema import typed_key
    from llm_perf_opt.settings_schema import SCHEMA

    for override in parsed:
        if override.is_delete() and typed_key(override.key_or_group):  # a typed node's field, or the node itself
            key = override.key_or_group
            raise UserError(
                f"~{key} would delete a typed setting, and a typed setting cannot be removed from the config",
                f"Set it instead ({key}=<value>; `--cfg job` shows its default), or leave it out",
            )
        kind = SCHEMA.get(override.key_or_group)
        if kind is None or override.is_delete() or (override.is_sweep_override() and not override.is_discrete_sweep()):
            continue
        values = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
        for value in values:
            if not (isinstance(value, str) and "${" in value):
                kind.check(override.key_or_group, value)


def _schema_error(exc: HydraException, command: str) -> UserError | None:
    """A value of the wrong type, or a key the typed schema lacks, set in a config file (the command line's are
    refused before composing): one paragraph naming the key; None for another composition error."""
    from omegaconf.errors import ConfigKeyError, ValidationError

    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, ValidationError | ConfigKeyError):
        cause = cause.__cause__ or cause.__context__
    if cause is None or not getattr(cause, "full_key", None):
        return None
    key, reason = str(cause.full_key), str(getattr(cause, "msg", cause)).splitlines()[0]
    problem = (
        f"{key} is not a setting of {command}"
        if isinstance(cause, ConfigKeyError)
        else f"a config file sets {key} to a value of the wrong type ({reason})"
    )
    return UserError(
        problem, f"Correct {key} in the config file that sets it; `{command} --cfg job` lists every setting"
    )


def _hydra_arguments() -> argparse.ArgumentParser:
    """The command line as Hydra's `@hydra.main` reads it (its flags; the overrides the rest), leniently: a flag's
    bad value is left for Hydra to refuse."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("overrides", nargs="*")
    switches = ("--help", "-h"), ("--hydra-help",), ("--version",), ("--resolve",), ("--run", "-r")
    for flags in (*switches, ("--multirun", "-m"), ("--shell-completion", "-sc")):
        parser.add_argument(*flags, action="store_true")
    valued = ("--cfg", "-c"), ("--package", "-p"), ("--config-path", "-cp"), ("--config-name", "-cn")
    for flags in (*valued, ("--config-dir", "-cd"), ("--experimental-rerun",)):
        parser.add_argument(*flags)
    parser.add_argument("--info", "-i", nargs="?", const="all")
    return parser


_ARGS = _hydra_arguments()


def _grammar_error(overrides: Sequence[str], command: str) -> UserError:
    """The first override Hydra cannot parse (`'run.repeats=[1'`, a key without `=value`), as one paragraph."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    for override in overrides:
        try:
            parser.parse_overrides([override])
        except OverrideParseException as exc:
            reason = next((line for line in str(exc).splitlines()[::-1] if line and not line.startswith("See ")), "")
            return UserError(
                f"the override {override!r} cannot be parsed ({reason.strip()})",
                "Write it as key=value (a list in brackets, closed: key=[a,b]; quote a value holding spaces or "
                f"brackets); `{command} --help` shows the syntax",
            )
    return UserError("the overrides cannot be parsed", f"Check their syntax; `{command} --help` shows it")


def _composed(setup: _Setup, overrides: Sequence[str]) -> DictConfig | None:
    """The config the command will run with (Hydra's section included); None when it cannot be composed here."""
    from llm_perf_opt.config_compose import compose_config

    try:
        return compose_config(setup.config_name, *overrides, *setup.search, return_hydra_config=True)
    except HydraException:
        return None


class _Setup(NamedTuple):
    """What composing a command's config takes besides the overrides."""

    config_name: str
    command: str
    config_dir: str | None  # --config-dir
    search: tuple[str, ...]  # the override putting config_dir on the search path, if any


def is_group(key: str, config_dir: str | None = None) -> bool:
    """A config group (`model`, `pipeline/torch_profiler`, a folder of `config_dir`) rather than a config key."""
    in_dir = config_dir is not None and (Path(config_dir) / key).is_dir()
    return "/" in key or in_dir or (files("llm_perf_opt") / "conf" / key).is_dir()


def _search_path(config_dir: str | None, overrides: Sequence[str]) -> tuple[str, ...] | None:
    """The override that puts `--config-dir` on the search path for composing (none without one); None when the
    command line sets hydra.searchpath itself, which is then left to Hydra."""
    if config_dir is None:
        return ()
    if any(override_key(o) == "hydra.searchpath" for o in overrides):
        return None
    return (f"hydra.searchpath=[file://{Path(config_dir).expanduser().resolve()}]",)


def _combinations(parsed: Sequence[Any], config_dir: str | None) -> Iterator[list[str]]:
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
        chosen = values if is_group(override.key_or_group, config_dir) else values[:1]
        options.append([f"{key}={value}" for value in chosen])
    yield from (list(combination) for combination in itertools.product(*options))


def _unknown_keys(
    setup: _Setup, overrides: Sequence[str]
) -> tuple[list[tuple[str, str]], list[str], DictConfig | None]:
    """The (key, override) pairs whose key the config lacks or that `+` adds inside a section of it, the config's
    keys without them, and the config composed with all of `overrides` where that was composed on the way (None
    otherwise: `_composed` composes it). A group option that does not exist raises a UserError."""
    adds = [o for o in overrides if _adds_key(o, setup.config_dir)]
    unknown, keys, composed = _missing_keys(setup, [o for o in overrides if o not in adds])
    if keys:
        unknown += [(override_key(o), o) for o in adds if _lands_in_a_section(override_key(o), keys)]
    return unknown, keys, None if adds or unknown else composed


def _missing_keys(
    setup: _Setup, overrides: Sequence[str]
) -> tuple[list[tuple[str, str]], list[str], DictConfig | None]:
    """The (key, override) pairs whose key the config lacks, the config's keys without them ([] when the config
    cannot be composed for another reason, which Hydra reports), and the config composed without them (None when it
    could not be)."""
    from llm_perf_opt.config_compose import compose_config

    remaining = list(overrides)
    unknown: list[tuple[str, str]] = []
    for _ in range(len(overrides) + 1):
        try:
            cfg = compose_config(setup.config_name, *remaining, *setup.search, return_hydra_config=True)
        except MissingConfigException as exc:
            error = _missing_option(exc, setup.command)
            if error is None:
                return unknown, [], None  # not a group option: Hydra reports it
            raise error from None
        except ConfigCompositionException as exc:
            match = _UNKNOWN.search(str(exc))
            culprit = next((o for o in remaining if match and override_key(o) == match.group(1)), None)
            if culprit is None:
                if (schema_error := _schema_error(exc, setup.command)) is not None:
                    raise schema_error from None
                return unknown, [], None  # another composition error: Hydra reports it
            unknown.append((override_key(culprit), culprit))
            remaining.remove(culprit)
            continue
        return unknown, _flat_keys(cfg), cfg
    return unknown, [], None


def _adds_key(override: str, config_dir: str | None) -> bool:
    """`+key=...` or `++key=...` of a config key (not a group, not Hydra's own settings)."""
    key = override_key(override)
    hydras = key == "hydra" or key.startswith("hydra.")
    return override.startswith("+") and not hydras and not is_group(key, config_dir)


def _lands_in_a_section(key: str, keys: Sequence[str]) -> bool:
    """Whether adding `key` puts a key nothing reads inside a section of the config (one not in OPEN_MAPS), or at
    the top level under a name close to a section's (`+modle.dtype`)."""
    if key in keys:
        return False
    parts = key.split(".")
    prefixes = (".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1))
    parent = next((p for p in prefixes if p in keys), None)
    if parent is None:
        top = [k for k in keys if "." not in k]
        return bool(difflib.get_close_matches(parts[0], top, n=1, cutoff=0.6))
    return not any(parent == m or parent.startswith(f"{m}.") for m in OPEN_MAPS)


def _missing_option(exc: MissingConfigException, command: str) -> UserError | None:
    """A group option that does not exist, as one paragraph listing the group's options; None for another missing
    config (e.g. a primary config that does not exist)."""
    missing = str(exc.missing_cfg_file or "")
    if "/" not in missing or not exc.options:
        return None
    from llm_perf_opt.config_schema import group_schemas

    group, choice = missing.rsplit("/", 1)
    schemas = {name for _, name, _ in group_schemas()}  # what a typed group's options build on, no option itself
    options = sorted(set(exc.options) - schemas)
    nearest = difflib.get_close_matches(choice, options, n=1, cutoff=0.6)
    fix = f"use {group}={nearest[0]} (the nearest option to {choice})" if nearest else "pick one of them"
    more = (
        "other options come with Hydra plugins (e.g. hydra-joblib-launcher for hydra/launcher=joblib)"
        if group.startswith("hydra/")
        else f"a config of your own goes in <dir>/{group}/<name>.yaml, used with --config-dir <dir>"
    )
    return UserError(
        f"{group}={choice} names no {group} config of {command} (the options: {', '.join(options)})", f"{fix}; {more}"
    )


def _flat_keys(cfg: DictConfig) -> list[str]:
    """Every dotted key path of `cfg` (containers and leaves; list items not descended)."""

    def walk(node: Any, prefix: str) -> Iterator[str]:
        if isinstance(node, dict):
            for name, value in node.items():
                yield f"{prefix}{name}"
                yield from walk(value, f"{prefix}{name}.")

    return list(walk(OmegaConf.to_container(cfg, resolve=False), ""))


def _nearest(key: str, keys: Sequence[str]) -> str | None:
    """The valid key closest to `key` (never one of its own sections: `whatif.x` is no typo of `whatif`)."""
    pool = [k for k in keys if k.startswith("hydra.") == key.startswith("hydra.") and not key.startswith(f"{k}.")]
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
    groups = [o for o in overrides if is_group(override_key(o)) and not o.startswith(("hydra", "+", "~"))]
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
    if any(override.startswith("+") for _, override in unknown):
        fixes.append(f"a leading + only adds a key that {command} never reads")
    return UserError(
        f"{names} {verb} of {command}{where}", f"{'; '.join(fixes)}; `{command} --cfg job` lists every setting"
    )
