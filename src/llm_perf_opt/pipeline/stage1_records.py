"""Stage 1's records of what a run ran, built from the objects that ran it: the inputs (`inputs.yaml`), the
predictions, the model and the device, the host's peak memory, and the run as `Stage1Analysis` sees it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from llm_perf_opt.config_data import CommandConfig
from llm_perf_opt.data.dataset import DatasetSelection, ImageEntry, TextEntry
from llm_perf_opt.data.inputs import InputChoice
from llm_perf_opt.instruments.host_usage import host_peak_rss_bytes
from llm_perf_opt.instruments.measured_peaks import MEASURED
from llm_perf_opt.instruments.timing import timing_method
from llm_perf_opt.measure.stage1_analysis import Stage1Setup
from llm_perf_opt.pipeline.stage1_settings import config_digest
from llm_perf_opt.records.stage1 import (
    DeviceInfo,
    ImageInput,
    InputFate,
    InputsManifest,
    ModelInfo,
    Prediction,
    RunSettings,
    SkippedInput,
    TextInput,
)
from llm_perf_opt.session.session import InferenceSession, device_name


def input_key(selection: DatasetSelection, path: Path) -> str:
    """An input's key in every per-image record: its path relative to the dataset root (its name when outside)."""
    try:
        return path.relative_to(selection.root).as_posix()
    except ValueError:
        return path.name


def _input_record(entry: ImageEntry | TextEntry) -> ImageInput | TextInput:
    if isinstance(entry, ImageEntry):
        return ImageInput(
            path=str(entry.path),
            width=entry.width,
            height=entry.height,
            bytes=entry.bytes,
            orientation=entry.orientation,
        )
    return TextInput(path=str(entry.path), characters=entry.characters, bytes=entry.bytes)


def inputs_manifest(inputs: InputChoice | None) -> InputsManifest:
    """`inputs.yaml`: the inputs the run discovered, ran and skipped."""
    assert inputs is not None
    sel = inputs.selection
    return InputsManifest(
        dataset_root=str(sel.root),
        subset_filelist=str(sel.subset_filelist) if sel.subset_filelist else None,
        discovered=sel.discovered,
        sampling=sel.sampling,
        seed=sel.seed,
        max_images=sel.max_images,
        count=len(sel.images),
        kind=inputs.kind,
        chosen_because=inputs.note,
        images=tuple(_input_record(e) for e in sel.images),
        skipped=tuple(SkippedInput(path=str(s.path), reason=s.reason) for s in sel.skipped),
        fates=tuple(InputFate(path=str(f.path), fate=f.fate, reason=f.reason) for f in sel.fates),
    )


def run_predictions(
    session: InferenceSession | None,
    selection: DatasetSelection | None,
    predicted: Mapping[str, tuple[int, ...]],
    strip_special_tokens: bool,
) -> tuple[Prediction, ...]:
    """The tokens generated for each input (first timed pass), decoded where the model has a tokenizer."""
    assert session is not None and selection is not None
    tokenizer = session.loaded.tokenizer
    paths = {input_key(selection, e.path): e.path for e in selection.images}
    return tuple(
        Prediction(
            image=name,
            path=str(paths.get(name, name)),
            token_ids=tuple(ids),
            tokens=len(ids),
            text=None
            if tokenizer is None
            else str(tokenizer.decode(list(ids), skip_special_tokens=strip_special_tokens)),
            weights=session.loaded.weights,
        )
        for name, ids in predicted.items()
    )


def model_info(session: InferenceSession) -> ModelInfo:
    """The model as built: its class, size, dtype, implementations, shape, weights (quantized ones too) and
    preprocessing."""
    described = session.adapter.describe(session.model)
    return ModelInfo(
        name=session.adapter.settings.name,
        adapter=session.adapter.settings.adapter,
        class_name=described.class_name,
        parameters=described.parameters,
        dtype=str(session.dtype).removeprefix("torch."),
        attn_implementation=described.attn_implementation,
        experts_implementation=described.experts_implementation,
        architecture=described.architecture,
        family=described.family,
        weights=session.loaded.weights,
        weights_detail=session.loaded.weights_detail,
        config_source=session.loaded.config_source,
        preprocess=session.adapter.preprocess_settings(),
        quantized=session.loaded.quantized,
    )


def device_info(session: InferenceSession) -> DeviceInfo:
    """The device the session ran on and how its stages were timed."""
    return DeviceInfo(
        type=session.device.type,
        name=device_name(session.device),
        index=session.device.index,
        timing_method=timing_method(session.device),
    )


def analysis_setup(
    command: CommandConfig,
    session: InferenceSession,
    run_id: str,
    settings: RunSettings,
    inputs: InputChoice | None,
) -> Stage1Setup:
    """The run as `Stage1Analysis` needs it: the records that describe it and the settings its figures use."""
    nodes = command.nodes
    assert settings.profiler is not None  # `stage1_settings.run_settings` records it
    return Stage1Setup(
        run_id=run_id,
        model=model_info(session),
        model_class=session.model.__class__.__name__,
        device=device_info(session),
        settings=settings,
        vision_stages=session.vision_stages,
        config_digest=config_digest(command.composed),
        inputs=len(inputs.selection.images) if inputs else 0,
        skipped=tuple(SkippedInput(path=str(s.path), reason=s.reason) for s in inputs.selection.skipped)
        if inputs
        else (),
        peak_tflops=nodes.hardware.peak_tflops,
        peak_bandwidth_gbps=nodes.hardware.peak_bandwidth_gbps,
        tf32_matmul=bool(torch.backends.cuda.matmul.allow_tf32),
        measured_peaks_asked=nodes.hardware.peaks == MEASURED,
        cv_warn=float(nodes.run.cv_warn),
        top_k=settings.profiler.top_k,
        compile=session.compile_summary() if session.runtime.compiles else None,
        host_peak_rss_bytes=host_peak_rss_bytes(),
    )
