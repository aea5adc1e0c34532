"""A thin layer over mdutils: tables from rows, and the number formats every report shares."""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import quote

from mdutils.mdutils import MdUtils

from llm_perf_opt.records.common import TimeBudget


def link_target(path: str) -> str:
    """A path as a Markdown link or image target: percent-encoded, so spaces, brackets and parentheses in file
    names keep the link valid (`viz/my page.png` -> `viz/my%20page.png`)."""
    return quote(path, safe="/")


def link(text: str, path: str) -> str:
    """`[text](path)` with the path as a valid link target."""
    return f"[{text}]({link_target(path)})"


class Doc:
    """A Markdown document built with mdutils."""

    def __init__(self, title: str) -> None:
        self._md = MdUtils(file_name="unused", title=title, title_header_style="atx")

    def h2(self, title: str) -> None:
        self._md.new_header(level=2, title=title, add_table_of_contents="n")

    def h3(self, title: str) -> None:
        self._md.new_header(level=3, title=title, add_table_of_contents="n")

    def para(self, text: str) -> None:
        self._md.new_paragraph(text)

    def bullets(self, items: Sequence[str]) -> None:
        if items:
            self._md.new_list([str(i) for i in items])
            self._md.new_line()

    def table(self, header: Sequence[str], rows: Sequence[Sequence[object]], align: str | list[str] = "left") -> None:
        """A table; numbers should already be formatted strings."""
        if not rows:
            self.para("_(none)_")
            return
        cells = [str(h) for h in header]
        for row in rows:
            cells.extend(str(c) for c in row)  # mdutils escapes "|" itself
        self._md.new_table(columns=len(header), rows=len(rows) + 1, text=cells, text_align=align)

    def image(self, alt: str, path: str) -> None:
        self._md.new_paragraph(MdUtils.new_inline_image(text=alt, path=link_target(path)))

    def raw(self, text: str) -> None:
        self._md.write(text)

    def text(self) -> str:
        return self._md.get_md_text().lstrip("\n") + "\n"


def ms(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def flops(value: float | None) -> str:
    """FLOPs with a unit prefix (GFLOP, TFLOP)."""
    if value is None:
        return "n/a"
    value = float(f"{value:.3g}")  # round first, so 999.9e9 reads "1 TFLOP", not "1e+03 GFLOP"
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if abs(value) >= scale:
            return f"{value / scale:,.3g} {unit}"
    return f"{value:,.0f} FLOP"


def pct(value: float | None, digits: int = 1) -> str:
    """A fraction as a percentage; a non-zero value too small for `digits` decimals keeps two significant digits."""
    if value is None:
        return "n/a"
    if value != 0 and abs(value * 100) < 0.5 * 10**-digits:
        return f"{value * 100:.2g}%"
    return f"{value * 100:.{digits}f}%"


def num_bytes(value: float | None) -> str:
    if value is None:
        return "n/a"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:,.2f} {unit}"
    return f"{value:,.0f} B"


def time_budget_text(budget: TimeBudget | None) -> str | None:
    """The run section's line on where the command's time went, in seconds (None: not recorded)."""
    if budget is None:
        return None
    return (
        f"Time budget: {budget.line} (seconds; `start` is from the process's start, imports included, to the "
        "pipeline's first step)."
    )
