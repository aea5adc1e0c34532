"""Hydra/OmegaConf config nodes as plain Python data."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf


def plain(cfg: Any) -> dict[str, Any]:
    """A Hydra mapping (DictConfig, resolved) or any mapping as a plain dict."""
    if isinstance(cfg, DictConfig):
        container = OmegaConf.to_container(cfg, resolve=True)
        assert isinstance(container, dict)
        return {str(k): v for k, v in container.items()}
    return dict(cfg)
