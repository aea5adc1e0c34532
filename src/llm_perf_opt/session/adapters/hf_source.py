"""Where a generic Hugging Face model comes from: a local checkpoint folder, a shipped preset or a config.json.

`model.name_or_path` (a checkpoint folder) and `model.config` (a preset from `conf/model_presets/` or a config.json:
random weights) are exclusive. Tokenizer and processor files come from the checkpoint folder, the config's folder,
or `model.tokenizer`. Local files only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from llm_perf_opt.errors import UserError
from llm_perf_opt.resources import package_folder
from llm_perf_opt.session.model_settings import ModelSettings

# transformers.utils.CONFIG_NAME, spelled here: `--help` and config composition read this module, which imports no
# transformers (tests/test_help_text.py; tests/test_hf_adapter.py checks the two names agree)
CONFIG_NAME = "config.json"

PRESET_SUFFIX = ".json"


def presets_dir() -> Path:
    """The folder of shipped model presets (config.json files named <preset>.json)."""
    return package_folder("conf/model_presets", "model presets", "pass model.config=<path to config.json>")


def preset_names() -> list[str]:
    """The shipped presets, sorted."""
    return sorted(p.stem for p in presets_dir().glob(f"*{PRESET_SUFFIX}"))


@attrs.frozen
class HfSource:
    """The architecture of a model to build or load, and where its files are."""

    config: Any  # a transformers PretrainedConfig
    weights_folder: Path | None  # a checkpoint to load weights from; None = random weights
    assets_folder: Path | None  # tokenizer / processor files, if any
    config_source: str  # one line for the reports


def hf_label(name_or_path: Any, config: Any) -> str:
    """A short model name for the reports: the preset name or the checkpoint / config folder's name."""
    given = name_or_path or config
    if not given:
        return "hf"
    path = Path(str(given)).expanduser()
    if path.name == CONFIG_NAME:
        path = path.parent
    return path.name or str(given)


def resolve_source(settings: ModelSettings) -> HfSource:
    """The model the settings (model=hf) name; every problem is a UserError raised before anything is built."""
    name_or_path, config = settings.name_or_path, settings.config
    if name_or_path and config:
        raise UserError(
            f"model.name_or_path={name_or_path} and model.config={config} are both set",
            "Set model.name_or_path to load a checkpoint's weights, or model.config to build random weights, not both",
        )
    if not name_or_path and not config:
        raise UserError(
            "model=hf needs a model: neither model.name_or_path nor model.config is set",
            f"Pass model.name_or_path=<local checkpoint folder>, or model.config=<preset or config.json> for random "
            f"weights (presets: {', '.join(preset_names())})",
        )
    tokenizer = _tokenizer_folder(settings.tokenizer)
    if name_or_path:
        folder = _checkpoint_folder(str(name_or_path))
        return HfSource(
            config=_read_config(folder / CONFIG_NAME, f"model.name_or_path={name_or_path}"),
            weights_folder=folder,
            assets_folder=tokenizer or folder,
            config_source=str(folder / CONFIG_NAME),
        )
    path, source = _config_file(str(config))
    return HfSource(
        config=_read_config(path, f"model.config={config}"),
        weights_folder=None,
        assets_folder=tokenizer or (None if source.startswith("preset") else path.parent),
        config_source=source,
    )


def _checkpoint_folder(name_or_path: str) -> Path:
    folder = Path(name_or_path).expanduser()
    if not folder.is_dir():
        raise UserError(
            f"model.name_or_path={name_or_path} is not a local folder (nothing is downloaded: Hub ids are not "
            "resolved)",
            "Download the checkpoint first (e.g. `hf download <repo> --local-dir <folder>`) and pass that folder, "
            "or use model.config=<preset or config.json> to build the architecture with random weights",
        )
    if not (folder / CONFIG_NAME).is_file():
        raise UserError(
            f"model.name_or_path={name_or_path} holds no config.json ({folder.resolve()} is not a transformers "
            "checkpoint folder)",
            "Point it at a folder written by save_pretrained (config.json, *.safetensors, tokenizer files)",
        )
    return folder.resolve()


def _config_file(config: str) -> tuple[Path, str]:
    """The config.json that `model.config` names, and a line saying where it came from."""
    preset = presets_dir() / f"{config}{PRESET_SUFFIX}"
    if "/" not in config and preset.is_file():
        return preset, f"preset {config} ({preset})"
    path = Path(config).expanduser()
    if path.is_dir():
        path = path / CONFIG_NAME
    if path.is_file():
        return path.resolve(), str(path.resolve())
    raise UserError(
        f"model.config={config} is neither a shipped preset nor an existing config.json (or a folder holding one)",
        f"Use one of the presets ({', '.join(preset_names())}) or a path to a transformers config.json",
    )


def _tokenizer_folder(tokenizer: Any) -> Path | None:
    if not tokenizer:
        return None
    folder = Path(str(tokenizer)).expanduser()
    if not folder.is_dir():
        raise UserError(
            f"model.tokenizer={tokenizer} is not a local folder",
            "Point model.tokenizer at a folder with tokenizer files (tokenizer.json / tokenizer_config.json), or "
            "leave it unset",
        )
    return folder.resolve()


def _read_config(path: Path, setting: str) -> Any:
    """The transformers config of a config.json; unknown model types are UserErrors."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(
            f"{setting}: {path} is not a readable JSON config ({type(exc).__name__}: {exc})",
            "Fix the file or point at a valid transformers config.json",
        ) from exc
    if not isinstance(data, dict) or not data.get("model_type"):
        raise UserError(
            f"{setting}: {path} has no model_type",
            'Add the transformers model type (e.g. "model_type": "llama") or use a config.json written by '
            "save_pretrained",
        )
    import transformers
    from huggingface_hub.errors import StrictDataclassError
    from transformers import CONFIG_MAPPING

    model_type = str(data["model_type"])
    if model_type not in CONFIG_MAPPING:
        raise UserError(
            f"{setting}: model type {model_type!r} in {path} is not known to transformers {transformers.__version__}",
            "Use a model type this transformers version implements (models that need trust_remote_code are not "
            "supported by the generic adapter), or upgrade transformers",
        )
    try:
        return CONFIG_MAPPING[model_type].from_dict(data)
    except (ValueError, TypeError, StrictDataclassError) as exc:
        reason = exc.__cause__ or exc  # a validation error wraps the ValueError that names the values
        raise UserError(
            f"{setting}: {path} is not a valid {model_type} config ({' '.join(str(reason).split())})",
            "Fix the values the message names, or start from a config.json written by save_pretrained",
        ) from exc
