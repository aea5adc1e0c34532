"""Readable GPU kernel names (shared by the Stage 1 operator tables and the Stage 2 kernel tables)."""

from __future__ import annotations

import re

MAX_SHORT_NAME = 90


def short_kernel_name(name: str) -> str:
    """The kernel's function name without return type, template arguments and parameters.

    `void at::native::elementwise_kernel<128, 4, ...>(int, ...)` -> `at::native::elementwise_kernel`.
    """
    text = name.strip().replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    if text.startswith("void "):
        text = text[len("void ") :]
    for index, char in enumerate(text):
        if char in "<(":
            text = text[:index]
            break
    text = text.strip() or name.strip()
    return text if len(text) <= MAX_SHORT_NAME else text[: MAX_SHORT_NAME - 1] + "…"


_FUNCTOR = re.compile(r"\b([A-Za-z_]\w*(?:Functor\w*|_kernel_cuda|_kernel_impl\w*|Op))\b")
_GENERIC = {"BinaryFunctor", "AUnaryFunctor", "BUnaryFunctor", "gpu_kernel_impl_nocast", "gpu_kernel_impl", "ReduceOp"}


def kernel_label(short_name: str, demangled: str) -> str:
    """`short_name`, plus the functor it applies when many kernels share that name.

    `elementwise_kernel` instantiated with `CUDAFunctor_add<c10::BFloat16>` -> `elementwise_kernel [CUDAFunctor_add]`.
    """
    for match in _FUNCTOR.finditer(demangled):
        word = match.group(1)
        if word not in _GENERIC and word != short_name:
            return f"{short_name} [{word}]"
    return short_name
