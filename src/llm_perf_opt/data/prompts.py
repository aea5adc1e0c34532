"""Select the text prompts a run of a text-only model will use.

The same rules as :func:`llm_perf_opt.data.dataset.select_images`, for UTF-8 ``.txt`` files (one prompt per
file): a folder listing or a subset file list, ``sorted`` / ``random`` / ``smallest`` (fewest characters first)
order, the first ``max_images`` usable prompts, and empty or undecodable files skipped with the reason (or fatal
with ``on_error="fail"``).
"""

from __future__ import annotations

import random
from importlib.resources import files
from pathlib import Path

from llm_perf_opt.data.dataset import (
    ON_ERRORS,
    SAMPLINGS,
    DatasetSelection,
    SkippedFile,
    TextEntry,
    _find_filelist,
    _read_filelist,
)
from llm_perf_opt.errors import UserError

PROMPT_SUFFIXES = (".txt",)  # matched case-insensitively

_ROOT_FIX = (
    "point dataset.root at a folder of UTF-8 .txt prompt files (one prompt per file), or use dataset=prompts "
    "without a root for the bundled prompts"
)


def bundled_prompts_dir() -> Path:
    """The folder of text prompts shipped inside the installed package."""
    resource = files("llm_perf_opt") / "data" / "prompts"
    if not isinstance(resource, Path) or not resource.is_dir():
        raise UserError(
            f"the bundled prompts folder {resource} is not a folder on disk",
            "reinstall llm-perf-opt as a regular (not zipped) package, or set dataset.root to a folder of .txt files",
        )
    return resource.resolve()


def select_prompts(
    root: str | Path,
    *,
    subset_filelist: str | Path | None = None,
    max_images: int | None = None,
    sampling: str = "sorted",
    seed: int = 0,
    on_error: str = "skip",
) -> DatasetSelection:
    """Choose the prompt files to run from ``root`` (see the module docstring); entries are :class:`TextEntry`."""
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
    root_path = Path(root).expanduser().resolve()
    if not root_path.is_dir():
        raise UserError(f"dataset.root {root_path} is not an existing folder", _ROOT_FIX)
    discovered = sorted(
        (p for p in root_path.rglob("*") if p.suffix.lower() in PROMPT_SUFFIXES and p.is_file()),
        key=lambda p: p.relative_to(root_path).as_posix(),
    )
    if not discovered:
        raise UserError(f"dataset.root {root_path} contains no .txt prompt files", _ROOT_FIX)
    list_path = None if subset_filelist is None else _find_filelist(subset_filelist, root_path)
    candidates = discovered if list_path is None else _read_filelist(list_path, root_path)
    probed = {path: _probe(path) for path in candidates} if sampling == "smallest" else {}
    if sampling == "random":
        candidates = list(candidates)
        random.Random(seed).shuffle(candidates)
    elif sampling == "smallest":
        candidates = sorted(candidates, key=lambda p: _size_key(probed[p]))

    prompts: list[TextEntry] = []
    skipped: list[SkippedFile] = []
    for path in candidates:
        if max_images is not None and len(prompts) >= max_images:
            break
        entry = probed.get(path) or _probe(path)
        if isinstance(entry, TextEntry):
            prompts.append(entry)
        elif on_error == "fail":
            raise UserError(
                f"{path} is not a usable prompt ({entry})",
                "replace or remove the file, or set dataset.on_error=skip to skip such files",
            )
        else:
            skipped.append(SkippedFile(path=path, reason=entry))
    if not prompts:
        source = f"the files listed in {list_path}" if list_path is not None else f"the files under {root_path}"
        first = f" (first: {skipped[0].path.name}: {skipped[0].reason})" if skipped else ""
        raise UserError(f"none of {source} is a usable text prompt{first}", _ROOT_FIX)
    return DatasetSelection(
        root=root_path,
        subset_filelist=list_path,
        discovered=len(discovered),
        images=tuple(prompts),
        skipped=tuple(skipped),
        max_images=max_images,
        seed=seed,
        sampling=sampling,
    )


def read_prompt(path: Path) -> str:
    """The prompt text of one file (UTF-8, surrounding whitespace removed)."""
    return path.read_text(encoding="utf-8").strip()


def _size_key(entry: TextEntry | str) -> float:
    return float(entry.characters) if isinstance(entry, TextEntry) else float("inf")


def _probe(path: Path) -> TextEntry | str:
    """A :class:`TextEntry` for a usable prompt file, else the reason it is not usable."""
    try:
        size = path.stat().st_size
        text = read_prompt(path)
    except UnicodeDecodeError as exc:
        return f"not UTF-8 text: {exc.reason} at byte {exc.start}"
    except OSError as exc:
        return f"cannot read file: {exc.strerror or exc}"
    if not text:
        return "empty prompt (no text)"
    return TextEntry(path=path, characters=len(text), bytes=size)
