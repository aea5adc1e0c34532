"""The kinds of value a setting takes (a boolean, a whole number within bounds, a number with a unit, one of some words,
a list of names, a folder inside the run folder, an output folder, a device, inductor options), each with its
`check`: a bad value is a one-paragraph :class:`UserError` naming the key and its fix. `config_schema`'s typed fields
declare theirs (`setting(default, kind)`), `settings_schema.SCHEMA` the untyped keys'. Torch-free.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePath
from typing import Final

import attrs

from llm_perf_opt.errors import UserError, require_bool, require_choice, require_number, require_whole

#: Longest name of one folder (NAME_MAX on Linux and macOS).
MAX_NAME_BYTES: Final = 255


@attrs.frozen
class Flag:
    """true or false (null too when `nullable`)."""

    nullable: bool = False

    def check(self, key: str, value: object) -> None:
        if not (value is None and self.nullable):
            require_bool(key, value)


@attrs.frozen
class Whole:
    """A whole number in [minimum, maximum]; `words` are also taken (`dataset.max_images=all`)."""

    minimum: int
    maximum: int | None = None
    nullable: bool = False
    words: tuple[str, ...] = ()

    def check(self, key: str, value: object) -> None:
        if (value is None and self.nullable) or (isinstance(value, str) and value in self.words):
            return
        require_whole(key, value, self.minimum, self.maximum)


@attrs.frozen
class Number:
    """A finite number ≥ low (> low when `above`), in `unit`."""

    low: float
    unit: str
    above: bool = False
    nullable: bool = False

    def check(self, key: str, value: object) -> None:
        if not (value is None and self.nullable):
            require_number(key, value, self.low, self.unit, above=self.above)


@attrs.frozen
class Choice:
    """One of `options` (null reads as none where none is one)."""

    options: tuple[str, ...]

    def check(self, key: str, value: object) -> None:
        require_choice(key, value, self.options)


@attrs.frozen
class Names:
    """A list of names (never one string, which would be read letter by letter); null when `nullable`."""

    example: str
    nullable: bool = True

    def check(self, key: str, value: object) -> None:
        if value is None and self.nullable:
            return
        if isinstance(value, str) or not isinstance(value, list | tuple):
            raise UserError(f"{key}={value} is not a list", f"Give a list in brackets, e.g. {key}=[{self.example}]")
        bad = [item for item in value if not isinstance(item, str) or not item.strip()]
        if bad:
            raise UserError(f"{key} holds {bad[0]!r}, which is not a name", f"Give names, e.g. {key}=[{self.example}]")


@attrs.frozen
class InsideRun:
    """A folder written by the run: relative ones must stay inside the run folder (absolute ones are used as
    they are), so the jobs of a sweep never share one by accident."""

    def check(self, key: str, value: object) -> None:
        if not isinstance(value, str) or not value.strip():
            raise UserError(f"{key}={value} is not a folder", f"Set {key} to a folder name inside the run folder")
        path = PurePath(os.path.expanduser(value))
        if not path.is_absolute() and os.path.normpath(path).split(os.sep)[0] == os.pardir:
            raise UserError(
                f"{key}={value} leaves the run folder (every run, and every job of a sweep, would write the same "
                "files there)",
                f"Set {key} to a folder inside the run folder (e.g. {path.name or 'predictions'}), or to an absolute "
                "path if the files are meant to go elsewhere",
            )
        _check_names(key, value)


@attrs.frozen
class OutputFolder:
    """A command's output folder (`hydra.run.dir`, `hydra.sweep.dir`, `model.cache_dir`): each name in it short
    enough for the file system; null when `nullable`."""

    nullable: bool = False
    words: tuple[str, ...] = ()  # also taken (whatif_run.inductor_cache=user|run)

    def check(self, key: str, value: object) -> None:
        if (value is None and self.nullable) or value in self.words:
            return
        if not isinstance(value, str) or not value.strip():
            raise UserError(f"{key}={value} is not a folder", f"Set {key} to a folder path")
        _check_names(key, value)
        path = Path(value).expanduser()
        if path.exists() and not path.is_dir():
            raise UserError(f"{key}={value} is a file, not a folder", f"Point {key} at a folder (or a new path)")


@attrs.frozen
class DeviceName:
    """Where a run runs: auto, cpu, cuda or cuda:N (whether that device exists is the session's to check)."""

    def check(self, key: str, value: object) -> None:
        name = str(value).strip().lower() if isinstance(value, str) else ""
        index = name.removeprefix("cuda:")
        if name not in ("auto", "cpu", "cuda") and not (name.startswith("cuda:") and index.isdigit()):
            raise UserError(f"{key}={value} is not a device name", f"Use {key}=auto, cpu, cuda or cuda:N")


@attrs.frozen
class InductorOptions:
    """Inductor options by name (`runtime.compile_options`), checked against the installed torch's inductor config
    (`compile_options`, which imports it: only when some are set)."""

    def check(self, key: str, value: object) -> None:
        if value not in (None, {}):
            from llm_perf_opt.compile_options import compile_options

            compile_options(value)


def _check_names(key: str, value: str) -> None:
    long = next((part for part in PurePath(value).parts if len(part.encode()) > MAX_NAME_BYTES), None)
    if long is not None:
        raise UserError(
            f"{key}: the folder name {long[:40]}… is {len(long.encode())} bytes long, more than the {MAX_NAME_BYTES} "
            "a file system takes",
            f"Shorten it in {key}",
        )


#: Any kind of setting.
Kind = Flag | Whole | Number | Choice | Names | InsideRun | OutputFolder | DeviceName | InductorOptions
