"""Text-prompt selection (llm_perf_opt.data.prompts) and the choice of inputs for what a model takes
(llm_perf_opt.data.inputs): the bundled prompts, sampling, bad files, and image/text mismatches."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from llm_perf_opt.config_schema import DatasetSchema
from llm_perf_opt.data.dataset import TextEntry, bundled_samples_dir
from llm_perf_opt.data.inputs import select_inputs
from llm_perf_opt.data.prompts import bundled_prompts_dir, read_prompt, select_prompts
from llm_perf_opt.errors import UserError

BUNDLED = ("code_review.txt", "email_summary.txt", "question_short.txt", "report_analysis.txt")


def names(selection) -> list[str]:
    return [e.path.name for e in selection.images]


def write(root: Path, name: str, text: str | bytes) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_bundled_prompts_are_real_text_of_different_lengths() -> None:
    sel = select_prompts(bundled_prompts_dir())
    assert names(sel) == list(BUNDLED)  # sorted; README.md is not a prompt
    lengths = [e.characters for e in sel.images]
    assert all(isinstance(e, TextEntry) for e in sel.images)
    assert min(lengths) < 200 < 2000 < max(lengths) and len(set(lengths)) == len(lengths)
    assert names(select_prompts(bundled_prompts_dir(), sampling="smallest", max_images=2)) == [
        "question_short.txt",
        "email_summary.txt",
    ]


def test_sampling_subset_and_recursion(tmp_path: Path) -> None:
    for i, words in enumerate((5, 1, 3)):
        write(tmp_path, f"p{i}.txt", "word " * words)
    write(tmp_path, "deep/p9.TXT", "x")
    write(tmp_path, "notes.md", "not a prompt")
    assert names(select_prompts(tmp_path)) == ["p9.TXT", "p0.txt", "p1.txt", "p2.txt"]
    assert names(select_prompts(tmp_path, sampling="smallest")) == ["p9.TXT", "p1.txt", "p2.txt", "p0.txt"]
    shuffled = names(select_prompts(tmp_path, sampling="random", seed=3))
    assert sorted(shuffled) == sorted(names(select_prompts(tmp_path))) and shuffled == names(
        select_prompts(tmp_path, sampling="random", seed=3)
    )
    write(tmp_path, "list.txt", "p2.txt\n# comment\np0.txt\n")
    sel = select_prompts(tmp_path, subset_filelist=tmp_path / "list.txt")
    assert names(sel) == ["p2.txt", "p0.txt"] and sel.discovered == 5


def test_bad_files_are_skipped_with_the_reason_or_fatal(tmp_path: Path) -> None:
    write(tmp_path, "a_empty.txt", "  \n")
    write(tmp_path, "b_binary.txt", b"\xff\xfe\x00bad")
    write(tmp_path, "c_good.txt", " Hello there. \n")
    sel = select_prompts(tmp_path)
    assert names(sel) == ["c_good.txt"]
    assert {s.path.name: s.reason for s in sel.skipped} == {
        "a_empty.txt": "empty prompt (no text)",
        "b_binary.txt": "not UTF-8 text: invalid start byte at byte 0",
    }
    assert read_prompt(sel.images[0].path) == "Hello there."
    with pytest.raises(UserError, match=r"a_empty\.txt is not a usable prompt \(empty prompt"):
        select_prompts(tmp_path, on_error="fail")


@pytest.mark.parametrize(
    ("setup", "kwargs", "needle"),
    [
        (lambda root: None, {}, "contains no .txt prompt files"),
        (lambda root: write(root, "a.txt", ""), {}, "none of the files under"),
        (lambda root: write(root, "a.txt", "hi"), {"sampling": "biggest"}, "dataset.sampling='biggest'"),
        (lambda root: write(root, "a.txt", "hi"), {"max_images": 0}, "dataset.max_images=0"),
    ],
)
def test_unusable_folders_are_user_errors(tmp_path: Path, setup, kwargs, needle: str) -> None:
    setup(tmp_path)
    with pytest.raises(UserError, match=re.escape(needle)) as err:
        select_prompts(tmp_path, **kwargs)
    assert err.value.fix


# ---- choosing inputs for the model's kind -----------------------------------------------------------------------
def _dataset(kind: str, root: Path, subset: str | None = None) -> DatasetSchema:
    return DatasetSchema(kind=kind, root=str(root), subset_filelist=subset)


def test_matching_kinds_use_the_configured_dataset(tmp_path: Path) -> None:
    write(tmp_path, "mine.txt", "my prompt")
    choice = select_inputs(_dataset("text", tmp_path), "text", model_name="m", max_images=None, sampling="sorted")
    assert (choice.kind, choice.note, names(choice.selection)) == ("text", None, ["mine.txt"])
    images = select_inputs(
        _dataset("image", bundled_samples_dir()), "image", model_name="m", max_images=1, sampling="smallest"
    )
    assert names(images.selection) == ["snippet_small.png"] and images.note is None


def test_a_text_model_on_the_default_samples_gets_the_bundled_prompts() -> None:
    choice = select_inputs(
        _dataset("image", bundled_samples_dir()), "text", model_name="qwen2_tiny", max_images=1, sampling="smallest"
    )
    assert choice.kind == "text"
    assert names(choice.selection) == ["question_short.txt"]
    assert choice.note is not None
    assert "qwen2_tiny takes text prompts" in choice.note and "dataset=prompts" in choice.note


def test_an_image_model_on_the_bundled_prompts_gets_the_samples() -> None:
    choice = select_inputs(
        _dataset("text", bundled_prompts_dir()), "image", model_name="llava", max_images=None, sampling="sorted"
    )
    assert choice.kind == "image" and len(choice.selection.images) == 5 and choice.note


@pytest.mark.parametrize(
    ("kind", "model_kind", "fix"),
    [("image", "text", "dataset=prompts dataset.root=<folder>"), ("text", "image", "dataset=samples")],
)
def test_a_dataset_of_ones_own_of_the_wrong_kind_is_a_user_error(
    tmp_path: Path, kind: str, model_kind: str, fix: str
) -> None:
    with pytest.raises(UserError) as err:
        select_inputs(_dataset(kind, tmp_path), model_kind, model_name="m", max_images=None, sampling="sorted")
    message = str(err.value)
    assert f"model m takes {'text prompts' if model_kind == 'text' else 'page images'}" in message
    assert str(tmp_path) in message and fix in message


def test_a_subset_list_on_the_bundled_samples_is_not_replaced() -> None:
    with pytest.raises(UserError, match="takes text prompts"):
        select_inputs(
            _dataset("image", bundled_samples_dir(), "lists/a4_page.txt"),
            "text",
            model_name="m",
            max_images=None,
            sampling="sorted",
        )


def test_unknown_dataset_kind(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"dataset\.kind=audio"):
        select_inputs(_dataset("audio", tmp_path), "text", model_name="m", max_images=None, sampling="sorted")


def test_a_subset_list_keeps_its_order_under_the_device_default_sampling(tmp_path: Path) -> None:
    """On a CPU the default sampling is `smallest`; a subset list still runs in its own order."""
    for name, text in (("long.txt", "many words " * 50), ("short.txt", "hi"), ("mid.txt", "a few words here")):
        write(tmp_path, name, text)
    write(tmp_path, "list.txt", "long.txt\nshort.txt\n")
    cfg = DatasetSchema(kind="text", root=str(tmp_path), subset_filelist=str(tmp_path / "list.txt"))
    chosen = select_inputs(cfg, "text", model_name="m", max_images=None, sampling="smallest")
    assert names(chosen.selection) == ["long.txt", "short.txt"]
    assert chosen.selection.sampling == "sorted"
    explicit = select_inputs(
        dataclasses.replace(cfg, sampling="smallest"), "text", model_name="m", max_images=None, sampling="smallest"
    )
    assert names(explicit.selection) == ["short.txt", "long.txt"]  # an explicit dataset.sampling still applies
