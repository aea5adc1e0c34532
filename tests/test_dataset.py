"""Tests for llm_perf_opt.data.dataset: discovery, subset lists, sampling, validation, bundled samples."""

from __future__ import annotations

import logging
import os
import signal
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from llm_perf_opt.data.dataset import (
    NOT_SELECTED,
    RUN,
    SKIPPED,
    DatasetSelection,
    ImageEntry,
    bundled_samples_dir,
    select_images,
)
from llm_perf_opt.data.inputs import InputChoice
from llm_perf_opt.errors import UserError
from llm_perf_opt.pipeline.stage1_records import inputs_manifest

BUNDLED = (
    "page_landscape.png",
    "page_portrait.png",
    "receipt_long.png",
    "slide_square.png",
    "snippet_small.png",
)


def make_image(path: Path, size: tuple[int, int] = (64, 48), fmt: str | None = None) -> Path:
    """Write a small white RGB image at ``path`` (format from the suffix unless ``fmt`` is given)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, "white").save(path, format=fmt)
    return path


def names(selection: DatasetSelection) -> list[str]:
    """File names of the selected images, in run order."""
    return [entry.path.name for entry in selection.images]


def fates(selection: DatasetSelection) -> list[tuple[str, str, str | None]]:
    """(file name, fate, reason) of every file the selection considered, in its order."""
    return [(f.path.name, f.fate, f.reason) for f in selection.fates]


def make_folder(root: Path, count: int) -> list[str]:
    """``count`` valid PNGs named img00.png, img01.png, ... under ``root``; return their names."""
    out = [f"img{i:02d}.png" for i in range(count)]
    for i, name in enumerate(out):
        make_image(root / name, size=(40 + i, 30 + i))
    return out


def test_discovery_is_recursive_case_insensitive_and_sorted(tmp_path: Path) -> None:
    make_image(tmp_path / "a.PNG", size=(10, 20), fmt="PNG")
    make_image(tmp_path / "b.JpG", size=(30, 40), fmt="JPEG")
    make_image(tmp_path / "sub" / "c.webp", size=(50, 60), fmt="WEBP")
    (tmp_path / "d.txt").write_text("not an image", encoding="utf-8")

    sel = select_images(tmp_path)

    assert sel.root == tmp_path.resolve()
    assert sel.discovered == 3
    assert [e.path.relative_to(tmp_path.resolve()).as_posix() for e in sel.images] == [
        "a.PNG",
        "b.JpG",
        "sub/c.webp",
    ]
    assert [(e.width, e.height) for e in sel.images] == [(10, 20), (30, 40), (50, 60)]
    assert all(e.path.is_absolute() and e.bytes == e.path.stat().st_size for e in sel.images)
    assert sel.skipped == ()
    assert (sel.sampling, sel.seed, sel.max_images, sel.subset_filelist) == ("sorted", 0, None, None)


def test_subset_filelist_relative_absolute_comments_and_duplicates(tmp_path: Path) -> None:
    root = tmp_path / "images"
    make_folder(root, 4)
    outside = make_image(tmp_path / "elsewhere" / "extra.png")
    filelist = tmp_path / "subset.txt"
    lines = ["# pages to run", "", "img03.png", f"  {outside}  ", "   # an indented comment", "img01.png"]
    lines.append("./img03.png")  # a duplicate of the first entry
    filelist.write_text("\n".join(lines) + "\n", encoding="utf-8")

    sel = select_images(root, subset_filelist=filelist)

    assert names(sel) == ["img03.png", "extra.png", "img01.png"]
    assert sel.subset_filelist == filelist.resolve()
    assert sel.discovered == 4  # the folder listing, before the subset is applied
    # Nothing is dropped silently: the repeated line is a listed skip, the unlisted files are not selected.
    assert fates(sel) == [
        ("img03.png", RUN, None),
        ("extra.png", RUN, None),
        ("img01.png", RUN, None),
        ("img03.png", SKIPPED, "listed again on line 7 of subset.txt (first on line 3): runs once"),
        ("img00.png", NOT_SELECTED, "not in dataset.subset_filelist subset.txt"),
        ("img02.png", NOT_SELECTED, "not in dataset.subset_filelist subset.txt"),
    ]


def test_subset_filelist_keeps_its_order_and_max_images_cuts_it(tmp_path: Path) -> None:
    make_folder(tmp_path, 5)
    filelist = tmp_path / "subset.txt"
    filelist.write_text("img04.png\nimg00.png\nimg02.png\n", encoding="utf-8")

    sel = select_images(tmp_path, subset_filelist=filelist, max_images=2)

    assert names(sel) == ["img04.png", "img00.png"]
    cut = "dataset.max_images=2 reached (dataset.sampling=sorted: in order)"
    assert fates(sel)[:3] == [("img04.png", RUN, None), ("img00.png", RUN, None), ("img02.png", NOT_SELECTED, cut)]
    assert {name for name, fate, _ in fates(sel)[3:]} == {"img01.png", "img03.png"}
    assert all(fate == NOT_SELECTED for _, fate, _ in fates(sel)[3:])


def test_subset_filelist_missing_entries_are_listed(tmp_path: Path) -> None:
    make_folder(tmp_path, 1)
    filelist = tmp_path / "subset.txt"
    missing = [f"gone{i:02d}.png" for i in range(12)]
    filelist.write_text("\n".join(["img00.png", *missing]) + "\n", encoding="utf-8")

    with pytest.raises(UserError) as info:
        select_images(tmp_path, subset_filelist=filelist)

    message = str(info.value)
    assert "12 file(s)" in message
    assert str(filelist.resolve()) in message
    for name in missing[:10]:
        assert name in message
    assert "gone10.png" not in message and "gone11.png" not in message
    assert "and 2 more" in message
    assert "img00.png" not in message


def test_subset_filelist_that_does_not_exist(tmp_path: Path) -> None:
    make_folder(tmp_path, 1)
    with pytest.raises(UserError, match=r"no_such_list\.txt is not a file"):
        select_images(tmp_path, subset_filelist=tmp_path / "no_such_list.txt")


def test_empty_folder_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("no images here", encoding="utf-8")
    with pytest.raises(UserError) as info:
        select_images(tmp_path)
    message = str(info.value)
    assert str(tmp_path.resolve()) in message
    assert "contains no" in message
    assert "bundled samples" in message


def test_missing_folder_and_file_as_root_are_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist") as info:
        select_images(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(info.value)
    assert "dataset.root" in str(info.value)

    a_file = make_image(tmp_path / "single.png")
    with pytest.raises(UserError, match="is not a folder"):
        select_images(a_file)


def test_bad_files_are_skipped_with_reasons_and_replaced(tmp_path: Path) -> None:
    make_image(tmp_path / "a_good.png")
    (tmp_path / "b_corrupt.png").write_bytes(b"this is not a png at all")
    whole = make_image(tmp_path / "full.png", size=(200, 200)).read_bytes()
    (tmp_path / "full.png").unlink()
    (tmp_path / "c_truncated.png").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "d_empty.jpg").write_bytes(b"")
    make_image(tmp_path / "e_good.png")
    make_image(tmp_path / "f_good.png")

    sel = select_images(tmp_path, max_images=2)

    # The three bad files come before the second good one, which takes their place.
    assert names(sel) == ["a_good.png", "e_good.png"]
    reasons = {s.path.name: s.reason for s in sel.skipped}
    assert list(reasons) == ["b_corrupt.png", "c_truncated.png", "d_empty.jpg"]
    assert reasons["b_corrupt.png"] == "not a readable image: cannot identify image file"
    assert reasons["c_truncated.png"].startswith("not a readable image:")
    assert "truncated" in reasons["c_truncated.png"]
    assert reasons["d_empty.jpg"] == "empty file (0 bytes)"
    assert sel.discovered == 6
    # Every discovered file has exactly one fate, in the order considered.
    assert [(n, f) for n, f, _ in fates(sel)] == [
        ("a_good.png", RUN),
        ("b_corrupt.png", SKIPPED),
        ("c_truncated.png", SKIPPED),
        ("d_empty.jpg", SKIPPED),
        ("e_good.png", RUN),
        ("f_good.png", NOT_SELECTED),
    ]
    assert fates(sel)[1][2] == reasons["b_corrupt.png"]
    assert fates(sel)[5][2] == "dataset.max_images=2 reached (dataset.sampling=sorted: in order)"


@pytest.mark.parametrize("sampling", ["sorted", "smallest"])
def test_a_dangling_symlink_is_listed_as_skipped_with_the_reason(tmp_path: Path, sampling: str) -> None:
    make_image(tmp_path / "a_good.png")
    (tmp_path / "b_gone.png").symlink_to(tmp_path / "deleted.png")  # the target never existed
    make_image(tmp_path / "c_good.png")

    sel = select_images(tmp_path, sampling=sampling)

    assert names(sel) == ["a_good.png", "c_good.png"]
    assert sel.discovered == 3
    reason = f"broken symbolic link: its target {tmp_path / 'deleted.png'} does not exist"
    assert [(s.path.name, s.reason) for s in sel.skipped] == [("b_gone.png", reason)]
    assert ("b_gone.png", SKIPPED, reason) in fates(sel)
    assert len(fates(sel)) == 3  # every file considered, once


@pytest.fixture
def never_hangs() -> Iterator[None]:
    """Fail the test, instead of waiting forever, if it blocks for 20 s (opening a named pipe with no writer)."""

    def give_up(signum: int, frame: object) -> None:
        raise TimeoutError("blocked for 20 s: a named pipe was opened")

    previous = signal.signal(signal.SIGALRM, give_up)
    signal.alarm(20)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize(("sampling", "listed"), [("sorted", False), ("smallest", False), ("sorted", True)])
def test_a_named_pipe_is_listed_as_skipped_never_opened(
    tmp_path: Path, sampling: str, listed: bool, never_hangs: None
) -> None:
    """Before: a FIFO named *.png was left out without a word (found by no listing, in no inputs.yaml); opened, it
    would block the run. Now it is skipped with the reason, in the selection and in inputs.yaml."""
    make_image(tmp_path / "a_good.png")
    os.mkfifo(tmp_path / "b_pipe.png")
    subset = tmp_path / "subset.txt"
    subset.write_text("a_good.png\nb_pipe.png\n")

    sel = select_images(tmp_path, sampling=sampling, subset_filelist=subset if listed else None)

    assert names(sel) == ["a_good.png"]
    reason = "not a regular file: a named pipe (FIFO), which is not read (reading it could wait forever)"
    assert ("b_pipe.png", SKIPPED, reason) in fates(sel)
    manifest = inputs_manifest(InputChoice(selection=sel, kind="image", note=None))
    assert [(Path(s.path).name, s.reason) for s in manifest.skipped] == [("b_pipe.png", reason)]


@pytest.mark.parametrize("sampling", ["sorted", "smallest"])
def test_a_page_above_pils_bomb_threshold_runs_with_one_clear_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, sampling: str
) -> None:
    """PIL's threshold scaled down to 1,000 px: a 40×40 page (1,600 px) stands for a 121-Mpx legal page against
    the real 89.5-Mpx threshold. It runs, without PIL's raw DecompressionBombWarning, and one log line names its
    size; a page above twice the threshold (PIL's error) is skipped with the reason."""
    from llm_perf_opt.data.images import open_upright

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    make_image(tmp_path / "a_legal.png", size=(40, 40))
    make_image(tmp_path / "b_huge.png", size=(50, 50))
    with warnings.catch_warnings(record=True) as raised, caplog.at_level(logging.INFO, "llm_perf_opt.dataset"):
        warnings.simplefilter("always")
        sel = select_images(tmp_path, sampling=sampling)
        open_upright(tmp_path / "a_legal.png")  # as the adapters and the gallery open it
    assert not [w for w in raised if issubclass(w.category, Image.DecompressionBombWarning)]
    assert names(sel) == ["a_legal.png"]
    notes = [r.getMessage() for r in caplog.records if "a_legal.png" in r.getMessage()]
    assert notes == [
        "a_legal.png is a large page: 40×40 px (0.0016 Mpx), above PIL's decompression-bomb warning threshold of "
        "0.001 Mpx; it runs as any page (PIL refuses images above 0.002 Mpx)"
    ]
    assert [(s.path.name, "exceeds limit" in s.reason) for s in sel.skipped] == [("b_huge.png", True)]


def test_on_error_fail_raises_naming_the_file(tmp_path: Path) -> None:
    make_image(tmp_path / "a_good.png")
    (tmp_path / "b_corrupt.png").write_bytes(b"garbage")

    with pytest.raises(UserError) as info:
        select_images(tmp_path, on_error="fail")

    message = str(info.value)
    assert str(tmp_path.resolve() / "b_corrupt.png") in message
    assert "dataset.on_error=skip" in message


def test_only_bad_files_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(b"garbage")
    (tmp_path / "b.jpg").write_bytes(b"")
    with pytest.raises(UserError, match=r"none of the files under .* is a readable image"):
        select_images(tmp_path)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"sampling": "shuffle"}, "dataset.sampling='shuffle'"),
        ({"on_error": "ignore"}, "dataset.on_error='ignore'"),
        ({"max_images": 0}, "dataset.max_images=0"),
    ],
)
def test_bad_options_are_user_errors(tmp_path: Path, kwargs: dict[str, Any], pattern: str) -> None:
    make_folder(tmp_path, 1)
    with pytest.raises(UserError, match=pattern):
        select_images(tmp_path, **kwargs)


def test_max_images_takes_the_first_in_sorted_order(tmp_path: Path) -> None:
    all_names = make_folder(tmp_path, 5)

    sel = select_images(tmp_path, max_images=3)
    assert names(sel) == all_names[:3]
    assert sel.max_images == 3

    assert names(select_images(tmp_path, max_images=50)) == all_names


def test_random_sampling_is_deterministic_per_seed(tmp_path: Path) -> None:
    all_names = make_folder(tmp_path, 12)

    first = select_images(tmp_path, sampling="random", seed=7, max_images=5)
    again = select_images(tmp_path, sampling="random", seed=7, max_images=5)
    other = select_images(tmp_path, sampling="random", seed=8, max_images=5)
    everything = select_images(tmp_path, sampling="random", seed=7)

    assert names(first) == names(again)
    assert len(first.fates) == 12 and {f.path.name for f in first.fates} == set(all_names)
    assert [f.path.name for f in first.fates if f.fate == RUN] == names(first)
    assert {f.reason for f in first.fates if f.fate != RUN} == {
        "dataset.max_images=5 reached (dataset.sampling=random: after shuffling with seed 7)"
    }
    assert len(names(first)) == 5 and set(names(first)) <= set(all_names)
    assert names(first) != names(other)
    assert names(everything)[:5] == names(first)  # max_images cuts the same shuffled order
    assert sorted(names(everything)) == all_names
    assert names(everything) != all_names
    assert (first.sampling, first.seed) == ("random", 7)


def test_bundled_samples_exist_and_are_small() -> None:
    folder = bundled_samples_dir()
    assert folder.is_dir()

    sel = select_images(folder)

    assert names(sel) == list(BUNDLED)
    assert sel.skipped == ()
    total = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    assert total < 2 * 1024 * 1024
    assert (folder / "README.md").is_file()


def test_bundled_samples_tile_counts_from_transformers() -> None:
    module = pytest.importorskip("transformers.models.deepseek_ocr2.image_processing_pil_deepseek_ocr2")
    processor = module.DeepseekOcr2ImageProcessorPil()
    entries: dict[str, ImageEntry] = {e.path.name: e for e in select_images(bundled_samples_dir()).images}

    tiles = {}
    for name in ("page_portrait.png", "snippet_small.png", "receipt_long.png"):
        with Image.open(entries[name].path) as img:
            tiles[name] = int(processor(img.convert("RGB"))["num_local_patches"][0])

    assert tiles == {"page_portrait.png": 6, "snippet_small.png": 0, "receipt_long.png": 4}
    assert max(entries["snippet_small.png"].width, entries["snippet_small.png"].height) <= 768
    readme = (bundled_samples_dir() / "README.md").read_text(encoding="utf-8")
    assert "| `page_portrait.png` |" in readme and "| 1240 x 1754 |" in readme
