"""Select the page images a run will use (:func:`select_images`), recording the fate of every file considered: run,
skipped or not selected, with the reason. Only image headers and sizes are kept in memory; a file that is not a
regular one (a named pipe, a socket, a device) is skipped, never opened.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import stat
import struct
from collections.abc import Callable
from pathlib import Path

import attrs
from PIL import Image, UnidentifiedImageError

from llm_perf_opt.data.images import large_page_note, open_upright, stored_size
from llm_perf_opt.errors import UserError
from llm_perf_opt.resources import package_folder

log = logging.getLogger("llm_perf_opt.dataset")

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")  # matched case-insensitively
SAMPLINGS = ("sorted", "random", "smallest")
ON_ERRORS = ("skip", "fail")

_ROOT_FIX = (
    "point dataset.root at a folder of .png/.jpg/.jpeg/.webp page images, or leave it unset to use the bundled samples"
)
_MAX_LISTED_MISSING = 10


@attrs.frozen
class ImageEntry:
    """An image that will be run, with its size as the model sees it (upright)."""

    path: Path  # absolute
    width: int  # pixels, after the EXIF orientation is applied
    height: int
    bytes: int  # file size
    orientation: int | None = None  # the EXIF orientation tag applied (1..8); None when the file has none


@attrs.frozen
class TextEntry:
    """A text prompt that will be run (see :mod:`llm_perf_opt.data.prompts`)."""

    path: Path  # absolute
    characters: int
    bytes: int  # file size


@attrs.frozen
class SkippedFile:
    """A selected file that is not a usable image, with the reason."""

    path: Path
    reason: str


RUN = "run"
SKIPPED = "skipped"
NOT_SELECTED = "not selected"


@attrs.frozen
class InputFate:
    """What happened to one file the selection considered."""

    path: Path  # absolute
    fate: str  # RUN | SKIPPED | NOT_SELECTED
    reason: str | None = None  # why it was skipped or not selected; None when it runs


@attrs.frozen
class DatasetSelection:
    """The images a run uses and how they were chosen."""

    root: Path  # absolute
    subset_filelist: Path | None
    discovered: int  # image files found under root (before subset/sampling/validation)
    images: tuple[ImageEntry | TextEntry, ...]  # exactly the inputs that will be run, in run order
    skipped: tuple[SkippedFile, ...]
    max_images: int | None
    seed: int
    sampling: str  # "sorted" | "random" | "smallest"
    # Every file considered, once each: the candidates in run order (run, skipped, or not selected because
    # max_images was reached), then repeated subset-list lines (skipped), then discovered files the subset list
    # leaves out (not selected).
    fates: tuple[InputFate, ...] = ()


def bundled_samples_dir() -> Path:
    """The folder of sample images shipped inside the installed package."""
    return package_folder("data/samples", "samples", "set dataset.root to a folder of page images")


@attrs.frozen
class InputKind:
    """What a selection looks for: which files, how to probe one, how to order them by size, how to name them."""

    noun: str  # "image" | "prompt"
    usable: str  # the adjective of a file that can run: "readable" | "usable"
    files: str  # "<suffixes> <noun>", as error messages list them
    suffixes: tuple[str, ...]  # matched case-insensitively
    probe: Callable[[Path], ImageEntry | TextEntry | str]  # an entry, or why the file is not usable
    size: Callable[[Path], float]  # for sampling="smallest"; unusable files sort last (inf)
    root_fix: str


def select_inputs(
    root: str | Path,
    kind: InputKind,
    *,
    subset_filelist: str | Path | None = None,
    max_images: int | None = None,
    sampling: str = "sorted",
    seed: int = 0,
    on_error: str = "skip",
) -> DatasetSelection:
    """Choose the files of `kind` to run from ``root`` (:func:`select_images` for page images).

    ``subset_filelist`` names a text file with one path per line (relative to ``root`` or absolute; blank lines and
    ``#`` comments ignored) that replaces the folder listing, in the list's order; a listed file that does not exist
    is a :class:`UserError` naming every such line, and a file listed twice runs once (its repeat a listed skip).
    ``sampling="sorted"`` keeps the order, ``"random"`` shuffles with ``random.Random(seed)``, ``"smallest"`` orders
    by size (an image's pixel count; unreadable files last); then the first ``max_images`` usable files are taken.
    Unusable files are skipped (``on_error="skip"``, the next file takes their place) or raise :class:`UserError`
    (``on_error="fail"``).
    """
    _check_selection_settings(max_images, sampling, on_error)
    root_path = _check_root(root, kind.root_fix)
    discovered = _discover(root_path, kind)
    list_path: Path | None = None
    repeats: list[InputFate] = []
    if subset_filelist is None:
        candidates = discovered
    else:
        list_path = _find_filelist(subset_filelist, root_path)
        candidates, repeats = _read_filelist(list_path, root_path)

    candidates = _ordered(candidates, kind, sampling, seed)
    entries, skipped, fates = _probe_in_order(
        candidates, kind, max_images, on_error, _cut_reason(max_images, sampling, seed)
    )
    fates.extend(repeats)
    if list_path is not None:
        listed = set(candidates)
        fates.extend(
            InputFate(path, NOT_SELECTED, f"not in dataset.subset_filelist {list_path.name}")
            for path in discovered
            if path not in listed
        )

    if not entries:
        source = f"the files listed in {list_path}" if list_path is not None else f"the files under {root_path}"
        first = f" (first: {skipped[0].path.name}: {skipped[0].reason})" if skipped else ""
        raise UserError(f"none of {source} is a {kind.usable} {kind.noun}{first}", kind.root_fix)

    return DatasetSelection(
        root=root_path,
        subset_filelist=list_path,
        discovered=len(discovered),
        images=tuple(entries),
        skipped=tuple(skipped),
        max_images=max_images,
        seed=seed,
        sampling=sampling,
        fates=tuple(fates),
    )


def _check_selection_settings(max_images: int | None, sampling: str, on_error: str) -> None:
    """UserError for a sampling, error policy or image count the selection does not take."""
    if sampling not in SAMPLINGS:
        raise UserError(
            f"dataset.sampling={sampling!r} is not supported",
            "set dataset.sampling to 'sorted', 'random' or 'smallest'",
        )
    if on_error not in ON_ERRORS:
        raise UserError(f"dataset.on_error={on_error!r} is not supported", "set dataset.on_error to 'skip' or 'fail'")
    if max_images is not None and max_images < 1:
        raise UserError(
            f"dataset.max_images={max_images} must be at least 1", "set it to a positive number or leave it unset"
        )


def _ordered(candidates: list[Path], kind: InputKind, sampling: str, seed: int) -> list[Path]:
    """The candidates in the order the sampling takes them."""
    if sampling == "random":
        shuffled = list(candidates)
        random.Random(seed).shuffle(shuffled)
        return shuffled
    if sampling == "smallest":
        return sorted(candidates, key=lambda path: float("inf") if _not_a_file(path) else kind.size(path))
    return candidates


def _probe_in_order(
    candidates: list[Path], kind: InputKind, max_images: int | None, on_error: str, cut_reason: str
) -> tuple[list[ImageEntry | TextEntry], list[SkippedFile], list[InputFate]]:
    """Probe the candidates in order until `max_images` are usable: the usable entries, the skipped files and every
    candidate's fate (run, skipped, or not selected once enough were found)."""
    entries: list[ImageEntry | TextEntry] = []
    skipped: list[SkippedFile] = []
    fates: list[InputFate] = []
    for path in candidates:
        if max_images is not None and len(entries) >= max_images:
            fates.append(InputFate(path, NOT_SELECTED, cut_reason))
            continue
        entry = _not_a_file(path) or kind.probe(path)
        if not isinstance(entry, str):
            entries.append(entry)
            fates.append(InputFate(path, RUN))
        elif on_error == "fail":
            raise UserError(
                f"{path} is not a usable {kind.noun} ({entry})",
                "replace or remove the file, or set dataset.on_error=skip to skip such files",
            )
        else:
            skipped.append(SkippedFile(path=path, reason=entry))
            fates.append(InputFate(path, SKIPPED, entry))
    return entries, skipped, fates


def _cut_reason(max_images: int | None, sampling: str, seed: int) -> str:
    order = {"sorted": "in order", "random": f"after shuffling with seed {seed}", "smallest": "smallest first"}
    return f"dataset.max_images={max_images} reached (dataset.sampling={sampling}: {order[sampling]})"


def _pixel_count(path: Path) -> float:
    """Width x height from the image header; unreadable files sort last."""
    try:
        width, height = stored_size(path)
        return float(width * height)
    except (OSError, ValueError, Image.DecompressionBombError):
        return float("inf")


def _check_root(root: str | Path, fix: str) -> Path:
    """``root`` as an absolute path; it must be an existing folder."""
    path = Path(root).expanduser().resolve()
    if not path.is_dir():
        raise UserError(f"dataset.root {path} {'is not a folder' if path.exists() else 'does not exist'}", fix)
    return path


def _discover(root: Path, kind: InputKind) -> list[Path]:
    """All files of `kind` under ``root`` (recursive), sorted by relative path; a broken symbolic link and a file
    that is not a regular one (a named pipe, a socket, a device) are found too, so that the selection lists them as
    skipped with the reason."""
    found = [p for p in root.rglob("*") if p.suffix.lower() in kind.suffixes and not p.is_dir()]
    if not found:
        raise UserError(f"dataset.root {root} contains no {kind.files} files", kind.root_fix)
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


# What a file that is not a regular one is, by its mode (`stat`).
_SPECIAL_FILES = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _not_a_file(path: Path) -> str | None:
    """Why `path` cannot be read as an input, told without opening it: a symbolic link whose target does not exist,
    or not a regular file (a named pipe, socket or device: reading one may wait forever); None for a regular file."""
    if path.is_symlink() and not path.exists():
        return f"broken symbolic link: its target {os.readlink(path)} does not exist"
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        return f"cannot read file: {exc.strerror or exc}"
    if stat.S_ISREG(mode):
        return None
    what = next((name for is_kind, name in _SPECIAL_FILES if is_kind(mode)), "of another kind")
    return f"not a regular file: {what}, which is not read (reading it could wait forever)"


def _find_filelist(subset_filelist: str | Path, root: Path) -> Path:
    """The subset list file: absolute, or relative to the working folder, or else relative to ``root``."""
    given = Path(subset_filelist).expanduser()
    tried = [given] if given.is_absolute() else [Path.cwd() / given, root / given]
    for path in tried:
        if path.is_file():
            return path.resolve()
    raise UserError(
        f"dataset.subset_filelist {subset_filelist} is not a file (looked at {', '.join(map(str, tried))})",
        "point dataset.subset_filelist at a text file with one image path per line, or leave it unset to use "
        "every image under dataset.root",
    )


def _read_filelist(list_path: Path, root: Path) -> tuple[list[Path], list[InputFate]]:
    """The files named in ``list_path`` in order, each once, and a skip for every repeated line."""
    paths: list[Path] = []
    first_line: dict[Path, int] = {}
    repeats: list[InputFate] = []
    missing: list[str] = []
    for number, raw in enumerate(list_path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        path = Path(line).expanduser()
        path = (path if path.is_absolute() else root / path).resolve()
        if path.is_dir() or not path.exists():  # a named pipe or device is listed as skipped with the reason
            missing.append(line)
        elif path in first_line:
            reason = f"listed again on line {number} of {list_path.name} (first on line {first_line[path]}): runs once"
            repeats.append(InputFate(path, SKIPPED, reason))
        else:
            first_line[path] = number
            paths.append(path)
    if missing:
        shown = ", ".join(missing[:_MAX_LISTED_MISSING])
        more = f" and {len(missing) - _MAX_LISTED_MISSING} more" if len(missing) > _MAX_LISTED_MISSING else ""
        raise UserError(
            f"{len(missing)} file(s) listed in dataset.subset_filelist {list_path} do not exist: {shown}{more}",
            f"fix or remove those lines (paths are relative to dataset.root {root}, or absolute)",
        )
    if not paths:
        raise UserError(
            f"dataset.subset_filelist {list_path} lists no files",
            "add one image path per line, or leave dataset.subset_filelist unset to use every image under dataset.root",
        )
    return paths, repeats


def _probe(path: Path) -> ImageEntry | str:
    """An :class:`ImageEntry` for a readable image (upright size), else the reason it is not usable."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        return f"cannot read file: {exc.strerror or exc}"
    if size == 0:
        return "empty file (0 bytes)"
    try:
        upright, orientation = open_upright(path)
        with upright:
            width, height = upright.size
    except UnidentifiedImageError:
        return "not a readable image: cannot identify image file"
    except (OSError, SyntaxError, ValueError, EOFError, struct.error, Image.DecompressionBombError) as exc:
        return f"not a readable image: {str(exc) or type(exc).__name__}"
    if width <= 0 or height <= 0:
        return f"image has no pixels ({width}x{height})"
    if (note := large_page_note(path, width, height)) is not None:
        log.info("%s", note)
    return ImageEntry(path=path, width=width, height=height, bytes=size, orientation=orientation)


IMAGES = InputKind(
    noun="image",
    usable="readable",
    files=".png/.jpg/.jpeg/.webp image",
    suffixes=IMAGE_SUFFIXES,
    probe=_probe,
    size=_pixel_count,
    root_fix=_ROOT_FIX,
)

#: :func:`select_inputs` of page images (entries are :class:`ImageEntry`).
select_images = functools.partial(select_inputs, kind=IMAGES)
