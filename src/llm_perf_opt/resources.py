"""Folders shipped inside the installed package (sample pages, prompts, model presets)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from llm_perf_opt.errors import UserError


def package_folder(relative: str, what: str, otherwise: str) -> Path:
    """The package's folder `relative` (e.g. "data/samples") on disk; `what` names it and `otherwise` is the
    alternative offered when the package is installed zipped."""
    resource = files("llm_perf_opt").joinpath(*relative.split("/"))
    if not isinstance(resource, Path) or not resource.is_dir():
        raise UserError(
            f"the bundled {what} folder {resource} is not a folder on disk",
            f"reinstall llm-perf-opt as a regular (not zipped) package, or {otherwise}",
        )
    return resource.resolve()
