"""NVTX ranges in the project's one domain (the `nvtx` package registers the strings, so Nsight capture
ranges work without NSYS_NVTX_PROFILER_REGISTER_ONLY=0)."""

from __future__ import annotations

import nvtx

from llm_perf_opt.records.vocabulary import NVTX_DOMAIN

_DOMAIN = nvtx.get_domain(NVTX_DOMAIN)


def push(name: str) -> None:
    """Open a range named `name` on the calling thread."""
    _DOMAIN.push_range(_DOMAIN.get_event_attributes(message=name))


def pop() -> None:
    """Close the innermost open range of the calling thread."""
    _DOMAIN.pop_range()
