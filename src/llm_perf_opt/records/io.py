"""Records to files and back (`save`, `load_file`; `read_json`/`read_yaml` for other artifacts' raw data): one
cattrs converter, atomic writes, and loaders that raise a `RecordError` naming the file and what to do for a file of
another schema major version, a damaged one, or one whose fields do not fit the record."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TypeVar

import attrs
import cattrs
import yaml
from cattrs.gen import make_dict_unstructure_fn

from llm_perf_opt.errors import UserError
from llm_perf_opt.records.common import SCHEMA_MAJOR, SCHEMA_VERSION, InconsistentRecord
from llm_perf_opt.records.stage1 import OptionValue

T = TypeVar("T")

converter = cattrs.Converter()
converter.register_unstructure_hook(Path, str)
converter.register_structure_hook(Path, lambda value, _: Path(value))
converter.register_structure_hook(OptionValue, lambda value, _: value)  # JSON keeps bool, int, float and str apart


def _has_derived(cls: type) -> bool:
    return attrs.has(cls) and any(not a.init for a in attrs.fields(cls))


# A derived field (attrs `init=False`, computed from the others: e.g. `ImageRecord.ttft_ms`) is written in its place
# among the fields, for the file's readers, and never read back: a loaded record derives it again.
converter.register_unstructure_hook_factory(
    _has_derived, lambda cls: make_dict_unstructure_fn(cls, converter, _cattrs_include_init_false=True)
)


class RecordError(UserError):
    """A record file that cannot be read back: missing, damaged, of another schema version, or of another kind."""


def to_plain(obj: object) -> object:
    """attrs records (and containers of them) as plain JSON/YAML-ready data."""
    return converter.unstructure(obj)


def dumps(record: object) -> str:
    """A record as the JSON text the toolkit writes (indented, no NaN)."""
    return json.dumps(to_plain(record), indent=2, allow_nan=False) + "\n"


def dumps_yaml(record: object) -> str:
    return str(yaml.safe_dump(to_plain(record), sort_keys=False, allow_unicode=True))


def atomic_write_text(target: Path, text: str) -> None:
    """Write `text` to `target` through a temporary file in the same folder, so a reader never sees half a file."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; run folders are meant to be shared
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# errno of a file system that has no hard links (some FUSE and SMB mounts): `create_exclusive` falls back to O_EXCL.
_NO_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS})


def create_exclusive(target: Path, text: str) -> None:
    """Write `text` to `target` only if no file is there: FileExistsError otherwise, and `target` is not touched.

    The text goes to a temporary file that is hard-linked to `target` (atomic, and unlike a rename it never replaces
    a file), so of several processes racing for `target` exactly one wins and a reader never sees it half written.
    """
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".new")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        try:
            os.link(tmp, target)
        except OSError as exc:
            if exc.errno not in _NO_LINKS:  # FileExistsError among them
                raise
            # no hard links: O_CREAT | O_EXCL (still exclusive; a reader may see it empty at first)
            excl_fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(excl_fd, "w", encoding="utf-8") as handle:
                handle.write(text)
    finally:
        Path(tmp).unlink(missing_ok=True)


def save(record: object, path: Path) -> Path:
    """Write `record` to `path` (JSON, or YAML for a `.yaml` suffix), atomically, parents created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, dumps_yaml(record) if path.suffix in (".yaml", ".yml") else dumps(record))
    return path


def _unreadable(path: Path, why: str) -> RecordError:
    return RecordError(
        f"{path} cannot be read as a run record: {why}",
        "Point the command at a folder written by this toolkit, or rerun the command that wrote it",
    )


def _parsed(path: Path, parse: Callable[[str], object], damaged: type[Exception]) -> object:
    """The file at `path` parsed by `parse`, or a RecordError (missing file, or `damaged` raised)."""
    path = Path(path)
    try:
        return parse(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _unreadable(path, "the file does not exist") from None
    except (OSError, UnicodeDecodeError, damaged) as exc:
        raise _unreadable(path, f"it is damaged ({type(exc).__name__}: {exc})") from None


def read_json(path: Path) -> object:
    """The parsed JSON of a record file, or a RecordError (missing or damaged file)."""
    return _parsed(path, json.loads, ValueError)


def read_yaml(path: Path) -> object:
    return _parsed(path, yaml.safe_load, yaml.YAMLError)


def check_schema(data: Mapping[str, object], path: Path) -> None:
    """Refuse a record of another schema major version (a missing version is read as 1.0)."""
    version = str(data.get("schema_version") or "1.0")
    if version.split(".", 1)[0] != SCHEMA_MAJOR:
        raise RecordError(
            f"{path} has schema_version {version}; this version of llm-perf-opt reads {SCHEMA_MAJOR}.x "
            f"(it writes {SCHEMA_VERSION})",
            "Read it with the llm-perf-opt release that wrote it, or rerun the command to write a current folder",
        )


def structure(data: object, cls: type[T], path: Path) -> T:
    """`data` as a `cls` record, or a RecordError naming the file and the field that did not fit."""
    try:
        return converter.structure(data, cls)
    except (cattrs.BaseValidationError, KeyError, TypeError, ValueError, AttributeError) as exc:
        detail = (
            "; ".join(cattrs.transform_error(exc, format_exception=_field_error))
            if isinstance(exc, cattrs.BaseValidationError)
            else str(exc)
        )
        raise _unreadable(path, f"its fields do not fit a {cls.__name__} record ({detail})") from None


def _field_error(exc: BaseException, expected: type | None) -> str:
    """What did not fit in a field: cattrs's words, or what an inconsistent record says of itself."""
    return str(exc) if isinstance(exc, InconsistentRecord) else cattrs.v.format_exception(exc, expected)


def load_file(path: Path, cls: type[T], *, versioned: bool = True) -> T:
    """The record of type `cls` in the JSON or YAML file `path`."""
    path = Path(path)
    data = read_yaml(path) if path.suffix in (".yaml", ".yml") else read_json(path)
    if versioned:
        if not isinstance(data, Mapping):
            raise _unreadable(path, "it does not hold a JSON object")
        check_schema(data, path)
    return structure(data, cls, path)


def load_lines(path: Path, cls: type[T]) -> tuple[T, ...]:
    """The records of a JSON-lines file (one record per non-empty line)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise _unreadable(path, "the file does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _unreadable(path, f"it is damaged ({exc})") from None
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except ValueError as exc:
            raise _unreadable(path, f"line {number} is damaged ({exc})") from None
        out.append(structure(data, cls, path))
    return tuple(out)


def dumps_lines(records: Iterable[object]) -> str:
    """Records as JSON lines (one compact object per line)."""
    return "".join(json.dumps(to_plain(r)) + "\n" for r in records)
