"""A thin layer over mdutils: tables from rows, the number formats every report shares, and the links a report keeps
(only to files that are there, without the machine's own paths)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from urllib.parse import quote, unquote

from mdutils.mdutils import MdUtils

from llm_perf_opt.artifacts import ArtifactsManager
from llm_perf_opt.records.common import TimeBudget

# The bundled samples folder wherever the package lies (…/llm_perf_opt/data/samples): named in reports by the config
# resolver that names it on every machine.
SAMPLES_PATH = re.compile(r"/[^\s,'\"=\[\]`]*/llm_perf_opt/data/samples(?=/|\b|$)")
SAMPLES_RESOLVER = "${llo_samples_dir:}"

# What `present_links` reads: code (fenced blocks, spans), left as it is, and Markdown links and images.
_CODE_OR_LINK = re.compile(
    r"(?P<code>^(?P<fence>```|~~~).*?^(?P=fence)|(?P<ticks>`+).+?(?P=ticks))"
    r"|(?P<bang>!?)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)\)",
    re.S | re.M,
)
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)


def link_target(path: str) -> str:
    """A path as a Markdown link or image target: percent-encoded, so spaces, brackets and parentheses in file
    names keep the link valid (`viz/my page.png` -> `viz/my%20page.png`)."""
    return quote(path, safe="/")


def link(text: str, path: str) -> str:
    """`[text](path)` with the path as a valid link target."""
    return f"[{text}]({link_target(path)})"


def bundled_samples(text: str) -> str:
    """`text` with the bundled samples folder's absolute path (this machine's or the one a record was written on)
    named by its resolver, `${llo_samples_dir:}`: a report of the bundled samples reads the same on every machine."""
    return SAMPLES_PATH.sub(SAMPLES_RESOLVER, text)


def present(folder: Path, files: Iterable[str]) -> list[str]:
    """The `files` (relative to `folder`, or absolute) that are there, sorted, each once: what a Files list links."""
    return sorted({f for f in files if (folder / f).exists()})


def present_links(text: str, folder: Path, own: str | None = None) -> str:
    """`text` (Markdown of a file in `folder`) with every relative link to a file that is not there turned into its
    text and every such image dropped: a report never links to a file that is absent (a folder copied without some
    of its files, a rung not run yet). Code blocks and spans are left alone; `own`: the file's own name, kept even
    before it is written."""

    def keep(match: re.Match[str]) -> str:
        target = match.group("target")
        if match.group("code") or target.startswith("#") or _SCHEME.match(target):
            return match.group(0)
        path = unquote(target.partition("#")[0])
        if path == own or (folder / path).exists():
            return match.group(0)
        return "" if match.group("bang") else match.group("text")

    return _CODE_OR_LINK.sub(keep, text)


def write_markdown(art: ArtifactsManager, relative: str, text: str) -> Path:
    """Write a report into the run folder with `present_links`: its links only to files that are there."""
    return art.write_text(relative, present_links(text, art.path(relative).parent, Path(relative).name))


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
        cells = [str(c) for row in (header, *rows) for c in row]  # mdutils escapes "|" itself
        self._md.new_table(columns=len(header), rows=len(rows) + 1, text=cells, text_align=align)

    def keyed_table(self, rows: Sequence[Mapping[str, object]]) -> None:
        """A table of rows that map each column's header to the row's cell (the first row's keys are the header)."""
        self.table(list(rows[0]) if rows else [], [list(row.values()) for row in rows])

    def image(self, alt: str, path: str) -> None:
        self._md.new_paragraph(MdUtils.new_inline_image(text=alt, path=link_target(path)))

    def raw(self, text: str) -> None:
        self._md.write(text)

    def text(self) -> str:
        return self._md.get_md_text().lstrip("\n") + "\n"


NA = "n/a"  # what a report shows for a figure it does not have


def number(value: float | None, digits: int = 1) -> str:
    """A figure with thousands separators and `digits` decimals, or n/a."""
    return NA if value is None else f"{value:,.{digits}f}"


ms = number  # a time in ms reads as a plain figure


def clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, the last one "…" where it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def ratio_text(value: float | None) -> str:
    """A ratio as `1.23×`, or n/a."""
    return NA if value is None else f"{value:.2f}×"


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
