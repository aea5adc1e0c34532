"""The inputs a run uses, for what the model takes: page images, or text prompts for text-only models.

A dataset config names its ``kind`` (``image``: conf/dataset/samples.yaml, ``text``: conf/dataset/prompts.yaml).
When it differs from the model's input kind and the dataset is a bundled default left as it is (no root or list
of the user's own), the bundled dataset of the model's kind is used instead and the choice is recorded; a dataset
of the user's own of the wrong kind is a :class:`UserError`. A subset list runs in its own order unless
``dataset.sampling`` is set explicitly (the device default sampling does not reorder it).
"""

from __future__ import annotations

from pathlib import Path

import attrs

from llm_perf_opt.config_schema import DatasetSchema
from llm_perf_opt.data.dataset import DatasetSelection, bundled_samples_dir, select_images
from llm_perf_opt.data.prompts import bundled_prompts_dir, select_prompts
from llm_perf_opt.errors import UserError

IMAGE = "image"
TEXT = "text"
_DATASET_OF = {IMAGE: "samples", TEXT: "prompts"}
_WHAT = {IMAGE: "page images", TEXT: "text prompts"}


@attrs.frozen
class InputChoice:
    """The selection and how it was chosen."""

    selection: DatasetSelection
    kind: str  # "image" | "text"
    note: str | None  # set when the bundled dataset of the model's kind replaced the configured default


def _bundled(kind: str) -> Path:
    return bundled_samples_dir() if kind == IMAGE else bundled_prompts_dir()


def select_inputs(
    dataset: DatasetSchema, input_kind: str, *, model_name: str, max_images: int | None, sampling: str
) -> InputChoice:
    """Select the run's inputs for a model taking `input_kind` inputs (see the module docstring), from the typed
    `dataset` node; `max_images` and `sampling` are its values with the device defaults applied."""
    kind = dataset.kind
    if kind not in _DATASET_OF:
        raise UserError(f"dataset.kind={kind} is not an input kind", "Set dataset.kind to image or text")
    root = Path(dataset.root).expanduser()
    subset = dataset.subset_filelist
    if subset is not None and dataset.sampling is None:
        sampling = "sorted"  # a subset list runs in its own order, whatever the device's default sampling
    note = None
    if kind != input_kind:
        untouched = subset is None and root.resolve() == _bundled(kind)
        if not untouched:
            raise UserError(
                f"model {model_name} takes {_WHAT[input_kind]}, but the dataset holds {_WHAT[kind]} "
                f"(dataset.kind={kind}, dataset.root={root})",
                f"Run it on {_WHAT[input_kind]}: dataset={_DATASET_OF[input_kind]} for the bundled ones, or "
                f"dataset={_DATASET_OF[input_kind]} dataset.root=<folder> for your own",
            )
        root = _bundled(input_kind)
        note = (
            f"model {model_name} takes {_WHAT[input_kind]}: the bundled {_WHAT[input_kind]} "
            f"(dataset={_DATASET_OF[input_kind]}) replace the default {_WHAT[kind]}"
        )
    select = select_images if input_kind == IMAGE else select_prompts
    selection = select(
        root,
        subset_filelist=subset,
        max_images=max_images,
        sampling=sampling,
        seed=dataset.seed,
        on_error=dataset.on_error,
    )
    return InputChoice(selection=selection, kind=input_kind, note=note)
