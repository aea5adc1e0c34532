"""`runtime.compile_options`: inductor options by name, checked against the installed torch's inductor config (the
name, and the value's type against the option's default). Below both the settings check and the session's runtime,
which read it; it imports torch's inductor only when options are set."""

from __future__ import annotations

from collections.abc import Mapping

from llm_perf_opt.errors import UserError, require_bool
from llm_perf_opt.records.stage1 import CompileOption


def compile_options(node: object) -> tuple[CompileOption, ...]:
    """`runtime.compile_options` (a mapping of inductor config names to values, set on top of the compile mode's
    own; a nested option such as `cpp.simdlen` as a nested mapping or a dotted name), checked against this torch's
    inductor config (the name, and the value's type against the option's default), sorted by name."""
    if node is None:
        return ()
    if not isinstance(node, Mapping):
        raise UserError(
            f"runtime.compile_options={node} is not a mapping",
            "Give inductor options by name, e.g. +runtime.compile_options.coordinate_descent_tuning=true",
        )
    import torch._inductor.config as inductor_config

    known = inductor_config.get_config_copy()
    out = [(name, _option_value(name, value, known)) for name, value in _flat_options(node, "")]
    return tuple(sorted(out))


def _flat_options(node: Mapping[object, object], prefix: str) -> list[tuple[str, object]]:
    """`node`'s (dotted name, value) pairs, nested mappings flattened (`{cpp: {simdlen: 4}}` -> `cpp.simdlen`)."""
    out: list[tuple[str, object]] = []
    for name, value in node.items():
        if isinstance(value, Mapping):
            out += _flat_options(value, f"{prefix}{name}.")
        else:
            out.append((f"{prefix}{name}", value))
    return out


def _option_value(name: str, value: object, known: Mapping[str, object]) -> bool | int | float | str:
    """`value` for the inductor option `name` when the option exists and `value` has its default's type."""
    key = f"runtime.compile_options.{name}"
    if name not in known:
        import torch

        raise UserError(
            f"{key} is not an option of torch {torch.__version__}'s inductor",
            "Use a name from torch._inductor.config (e.g. coordinate_descent_tuning, max_autotune, "
            "max_autotune_gemm_backends, cpp.simdlen), or remove it",
        )
    default = known[name]
    if isinstance(default, bool):
        return require_bool(key, value)
    if isinstance(default, int | float) and not isinstance(value, bool) and isinstance(value, int | float):
        return value
    if isinstance(default, str) and isinstance(value, str):
        return value
    if default is None and isinstance(value, bool | int | float | str):
        return value
    kind = type(default).__name__ if default is not None else "plain value"
    raise UserError(
        f"{key}={value} does not fit the option (inductor's default is {default!r}, a {kind})",
        f"Give {key} a value of that type, or remove it",
    )
