"""Readable GPU kernel names (shared by the Stage 1 operator tables and the Stage 2 kernel tables)."""

from __future__ import annotations

import re

MAX_SHORT_NAME = 90


def short_kernel_name(name: str) -> str:
    """The kernel's function name without return type, template arguments and parameters.

    `void at::native::elementwise_kernel<128, 4, ...>(int, ...)` -> `at::native::elementwise_kernel`. A mangled name
    (`_ZN7cutlass13device_kernel…`) is read back to its qualified name, and a generic entry point such as cutlass's
    `device_kernel` gets the kind of work its template arguments name: `cutlass::device_kernel (grouped GEMM)`.
    """
    full = name.strip()
    text = full.replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    text = _demangled_prefix(text) or text
    text = re.split(r"[<(]", text.removeprefix("void "), maxsplit=1)[0].strip() or full
    if text.rsplit("::", 1)[-1] in _GENERIC_ENTRY and (kind := _first_kind(_WORK_KINDS, full)):
        text = f"{text} ({kind})"
    return text if len(text) <= MAX_SHORT_NAME else text[: MAX_SHORT_NAME - 1] + "…"


_LENGTH = re.compile(r"(\d+)")
_GENERIC_ENTRY = {"device_kernel", "Kernel", "Kernel2"}  # cutlass's entry points: the work is in the template
# (what the template arguments say, lower case) -> the kind of work; the first match wins
_WORK_KINDS = (
    (("groupedgemm", "grouped_gemm", "moeproblemshape", "groupproblemshape"), "grouped GEMM"),
    (("fmha", "flash", "attention"), "attention"),
    (("conv",), "convolution"),
    (("gemm", "mma"), "GEMM"),
)


def _demangled_prefix(text: str) -> str | None:
    """The qualified name at the head of an Itanium-mangled name (`_ZN7cutlass13device_kernelI…` ->
    `cutlass::device_kernel`); None when `text` is not mangled."""
    if not text.startswith("_Z"):
        return None
    i = 3 if text.startswith("_ZN") else 2
    while i < len(text) and text[i] in "KVr":  # cv-qualifiers of a nested name
        i += 1
    parts = []
    while (match := _LENGTH.match(text, i)) is not None:
        size = int(match.group(1))
        start = match.end()
        parts.append(text[start : start + size])
        i = start + size
    return "::".join(parts) or None


def _first_kind(table: tuple[tuple[tuple[str, ...], str], ...], text: str) -> str | None:
    """The kind of the first row of `table` with one of its words in `text` (compared in lower case)."""
    lowered = text.lower()
    return next((kind for words, kind in table if any(w in lowered for w in words)), None)


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


# The kind of work a kernel does, for the advice (`kernel_kind`): one place that reads kernel and operator names.
GEMM = "GEMM"
ATTENTION = "attention"
ELEMENTWISE = "elementwise"
COPY = "copy"
OTHER = "other"

# (words in the name, lower case) -> kind; the first match wins, so attention (flash, fmha) comes before GEMM (cutlass
# runs both), inductor's pointwise and reduction kernels before GEMM (their names list the ops they fuse, such as
# `triton_poi_fused_add_convolution_0`) and copies before elementwise (a copy is an elementwise kernel of `copy`).
_KERNEL_KINDS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("flash", "fmha", "sdpa", "attention", "scaled_dot_product", "mha_"), ATTENTION),
    (("triton_poi", "triton_red", "triton_per"), ELEMENTWISE),
    # triton_tem: inductor's matmul templates (grouped_mm also matches aten::_grouped_mm)
    (("nvjet", "gemm", "cutlass", "cublas", "xmma", "wgmma", "triton_tem", "grouped_mm", "conv"), GEMM),
    (("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"), GEMM),
    (("memcpy", "memset", "copy", "contiguous", "aten::cat", "catarray", "aten::clone", "constant_pad"), COPY),
    (("elementwise", "vectorized", "functor", "reduce", "norm", "softmax", "gelu", "silu", "sigmoid"), ELEMENTWISE),
    (("aten::add", "aten::mul", "aten::sub", "aten::div"), ELEMENTWISE),
)


def kernel_kind(label: str) -> str:
    """GEMM, attention, elementwise, copy or other, for a kernel as the module tables name it: `kernel (operator)`
    or a bare kernel name (whose own parentheses, such as `cutlass::device_kernel (attention)`, stay part of it).
    The kernel's name decides; the operator that launched it only where the name alone says nothing:
    `nvjet_sm90_… (aten::addmm)` is a GEMM, `elementwise_kernel (aten::mul)` elementwise."""
    head, sep, tail = label.rpartition(" (")
    kernel, operator = (head, tail.removesuffix(")")) if sep and "::" in tail else (label, "")
    return _first_kind(_KERNEL_KINDS, kernel) or _first_kind(_KERNEL_KINDS, operator) or OTHER
