"""The README is a front door and the docs hold together: every relative Markdown link in README.md, docs/ and the
shipped examples (examples/, their rendered reports included) resolves (to a file, and to a heading when it names
one), the README stays short, points nowhere outside the repository, keeps its install and test commands, names every
console script and states the versions pyproject.toml declares, and every guide is reachable from it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
EXAMPLES = ROOT / "examples"
PAGES = [README, *sorted(DOCS.rglob("*.md")), *sorted(EXAMPLES.rglob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"(`+).+?\1", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The text without fenced code blocks and code spans (brackets there are not links)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces to
    hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _links(page: Path) -> list[str]:
    return LINK.findall(_prose(page.read_text(encoding="utf-8")))


def _relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in filter(_relative, _links(page)):
        path, _, anchor = target.partition("#")
        dest = (page.parent / unquote(path)).resolve() if path else page  # reports percent-encode their targets
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
        elif ROOT not in dest.parents and dest != ROOT:
            broken.append(f"{target}: outside the repository")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_link_check_sees_links_and_anchors() -> None:
    # guards the checker itself: a page with no links found, or headings slugged wrongly, would pass vacuously
    assert "docs/guide/stage1.md" in _links(README)
    assert "decoding-the-way-it-is-deployed-static-kv-cache-and-compiled-decode" in _anchors(DOCS / "guide/stage1.md")
    assert "deployed-decode-configurations-issue-11" in _anchors(DOCS / "benchmarks-history.md")
    assert LINK.findall(_prose("`[a](b)` [c](d)\n```\n[e](f)\n```\n")) == ["d"]  # code is no link
    assert "../images/h100_roofline.png" in _links(DOCS / "guide" / "stage1.md")  # images count as links
    # the examples' rendered reports are checked too: a rung report's Files list, whatif.md's plots and rung folders
    assert "metrics.json" in _links(EXAMPLES / "whatif-h100-decode" / "rungs" / "00-baseline" / "report.md")
    assert "plots/waterfall.png" in _links(EXAMPLES / "whatif-h100-all" / "whatif.md")
    assert "rungs/00-baseline/report.md" in _links(EXAMPLES / "whatif-h100-decode" / "whatif.md")


def test_readme_is_a_short_front_door() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    assert "../shared" not in text and "shared/reference" not in text


def test_docs_point_nowhere_outside_the_repository() -> None:
    for page in PAGES:
        assert "../shared" not in page.read_text(encoding="utf-8"), page


def test_readme_keeps_the_install_and_test_commands() -> None:
    lines = [line.split("#")[0].strip() for line in README.read_text(encoding="utf-8").splitlines()]
    for command in (
        "python3 -m venv .venv && . .venv/bin/activate",
        "pip install torch",
        'pip install -e ".[dev]"',
        "stage1-run",
        "pytest -q",
    ):
        assert command in lines, command
    assert "`pixi run stage1-run`" in README.read_text(encoding="utf-8")


def test_readme_names_every_command_and_links_every_guide() -> None:
    text = README.read_text(encoding="utf-8")
    manifest = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for script in manifest["project"]["scripts"]:
        assert f"`{script}`" in text, script
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in filter(_relative, _links(README))}
    for guide in sorted((DOCS / "guide").glob("*.md")):
        if guide.name != "README.md":
            assert guide.resolve() in linked, f"README does not link {guide.relative_to(ROOT)}"
    assert (DOCS / "architecture.md").resolve() in linked and (DOCS / "benchmarks.md").resolve() in linked


def test_readme_states_the_declared_versions() -> None:
    text = README.read_text(encoding="utf-8")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert f"Python ≥ {project['requires-python'].removeprefix('>=')}" in text
    declared = {re.split(r"[<>=!~ ]", d, maxsplit=1)[0]: d for d in project["dependencies"]}
    assert f"torch ≥ {declared['torch'].removeprefix('torch>=')}" in text
    assert f"transformers {declared['transformers'].removeprefix('transformers>=')} to the newest" in text


def test_the_bad_input_section_stays_in_a_guide() -> None:
    # other work amends this paragraph; it lives in the configuration guide under its own heading
    assert "bad-input" in _anchors(DOCS / "guide" / "configuration.md")
