"""Select the text prompts a run of a text-only model will use: the rules of
:func:`llm_perf_opt.data.dataset.select_inputs`, for UTF-8 ``.txt`` files (one prompt per file; ``smallest``: fewest
characters first; empty or undecodable files skipped with the reason, or fatal with ``on_error="fail"``).
"""

from __future__ import annotations

import functools
from pathlib import Path

from llm_perf_opt.data.dataset import InputKind, TextEntry, select_inputs
from llm_perf_opt.resources import package_folder

PROMPT_SUFFIXES = (".txt",)  # matched case-insensitively

_ROOT_FIX = (
    "point dataset.root at a folder of UTF-8 .txt prompt files (one prompt per file), or use dataset=prompts "
    "without a root for the bundled prompts"
)


def bundled_prompts_dir() -> Path:
    """The folder of text prompts shipped inside the installed package."""
    return package_folder("data/prompts", "prompts", "set dataset.root to a folder of .txt files")


def read_prompt(path: Path) -> str:
    """The prompt text of one file (UTF-8, surrounding whitespace removed)."""
    return path.read_text(encoding="utf-8").strip()


def _characters(path: Path) -> float:
    """Characters of a usable prompt; unusable files sort last."""
    entry = _probe(path)
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


PROMPTS = InputKind(
    noun="prompt",
    usable="usable",
    files=".txt prompt",
    suffixes=PROMPT_SUFFIXES,
    probe=_probe,
    size=_characters,
    root_fix=_ROOT_FIX,
)

#: :func:`~llm_perf_opt.data.dataset.select_inputs` of prompt files (see the module docstring; entries are
#: :class:`TextEntry`).
select_prompts = functools.partial(select_inputs, kind=PROMPTS)
