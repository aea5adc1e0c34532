"""Readable GPU kernel names (shared by the Stage 1 operator tables and the Stage 2 kernel tables)."""

from __future__ import annotations

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
