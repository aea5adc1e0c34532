"""Build once, reuse (issue 25): a random-weights model saved by the first process and loaded by later ones gives
the same parameters and outputs as building it; a stale or damaged saved model is rebuilt with the reason logged;
stage2-profile's and perf-whatif's child processes are told where it lives (and share inductor's cache)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

from helpers import stage2_run, stage2_settings
from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import command_config, plain, whatif_nodes
from llm_perf_opt.override_text import quoted_override
from llm_perf_opt.pipeline.stage1_settings import config_digest
from llm_perf_opt.pipeline.stage2 import MODEL_CACHE_DIR, workload_argv
from llm_perf_opt.pipeline.whatif_hydra import phase_command
from llm_perf_opt.pipeline.whatif_rungs import (
    INDUCTOR_CACHE_DIR,
    INDUCTOR_CACHE_ENV,
    RungJob,
    child_env,
    shared_caches,
    stage1_command,
)
from llm_perf_opt.session import saved_model
from llm_perf_opt.session.model_settings import ModelSettings
from llm_perf_opt.session.session import InferenceSession

CPU = torch.device("cpu")
NEW_TOKENS = 3


def compose_stage2(*overrides: str) -> Any:
    return compose_config("stage2", *overrides)


def _settings(compose_model: Any, name: str, cache_dir: Path | None = None) -> ModelSettings:
    settings = ModelSettings.from_config(plain(compose_model(f"model={name}")))
    return attrs.evolve(settings, cache_dir=None if cache_dir is None else str(cache_dir))


def _tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def _slot(cache: Path) -> Path:
    (slot,) = [p for p in cache.iterdir() if p.is_dir()]
    return slot


def _load(settings: ModelSettings, caplog: pytest.LogCaptureFixture) -> tuple[InferenceSession, str]:
    """A session of `settings` on the CPU, and what the saved-model cache logged while it was made."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="llm_perf_opt.saved_model"):
        session = InferenceSession.load(settings, CPU)
    return session, "\n".join(r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("name", ["deepseek_ocr_tiny", "deepseek_ocr2_tiny"])
def test_a_loaded_model_has_the_parameters_and_outputs_of_a_built_one(
    name: str, compose_model: Any, page_images: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    built = InferenceSession.load(_settings(compose_model, name), CPU)
    first, said = _load(_settings(compose_model, name, tmp_path), caplog)
    assert "no saved model yet" in said and "saved the model to" in said
    assert "saved to the run's model cache" in first.loaded.weights_detail
    loaded, said = _load(_settings(compose_model, name, tmp_path), caplog)
    assert "loaded from the saved model cache" in said
    detail = loaded.loaded.weights_detail
    assert detail.startswith("random weights (seed 0)") and saved_model.LOADED_NOTE in detail
    assert loaded.loaded.weights == "random"
    want, got = _tensors(built.model), _tensors(loaded.model)
    assert want.keys() == got.keys()
    for key, tensor in want.items():
        assert got[key].dtype == tensor.dtype and torch.equal(got[key], tensor), key
        assert got[key].requires_grad == tensor.requires_grad
    assert not any(t.is_meta for t in got.values())
    for session in (built, loaded):
        session.keep_prefill_logits = True
    page = page_images["small"]
    a, b = built.run_image(page, NEW_TOKENS, nvtx=False), loaded.run_image(page, NEW_TOKENS, nvtx=False)
    assert a.token_ids == b.token_ids and len(a.token_ids) == NEW_TOKENS
    assert a.prefill_logits is not None and b.prefill_logits is not None
    assert torch.equal(a.prefill_logits, b.prefill_logits)


def test_a_manifest_of_another_model_is_rebuilt_with_the_reason(
    compose_model: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = _settings(compose_model, "deepseek_ocr2_tiny", tmp_path)
    built, _ = _load(settings, caplog)
    manifest = _slot(tmp_path) / saved_model.MANIFEST_FILE
    for field, value in (("config_digest", "sha256:0"), ("transformers", "4.46.0"), ("seed", 7)):
        data = json.loads(manifest.read_text())
        data["key"][field] = value
        manifest.write_text(json.dumps(data))
        session, said = _load(settings, caplog)
        assert "not used: it was saved for another model" in said and field.replace("_", " ") in said
        assert "saved to the run's model cache" in session.loaded.weights_detail
        assert all(torch.equal(t, _tensors(built.model)[k]) for k, t in _tensors(session.model).items())
    _, said = _load(settings, caplog)  # rebuilt and saved again: now it is reused
    assert "loaded from the saved model cache" in said


def test_a_truncated_or_damaged_file_is_rebuilt(compose_model: Any, tmp_path: Path, caplog: Any) -> None:
    settings = _settings(compose_model, "deepseek_ocr_tiny", tmp_path)
    built, _ = _load(settings, caplog)
    weights = _slot(tmp_path) / saved_model.WEIGHTS_FILE
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])
    session, said = _load(settings, caplog)
    assert "truncated or replaced" in said and "building it" in said
    assert all(torch.equal(t, _tensors(built.model)[k]) for k, t in _tensors(session.model).items())
    assert weights.stat().st_size == len(whole)  # saved again, whole
    weights.write_bytes(b"\0" * len(whole))  # the right size, unreadable
    _, said = _load(settings, caplog)
    assert "do not match its manifest's hash" in said
    manifest = _slot(tmp_path) / saved_model.MANIFEST_FILE
    manifest.write_text("{")
    _, said = _load(settings, caplog)
    assert "manifest.json cannot be read (it is damaged" in said
    manifest.unlink()
    _, said = _load(settings, caplog)
    assert "manifest.json is missing" in said


def test_an_overwrite_of_the_same_size_is_rebuilt(
    compose_model: Any, page_images: dict[str, Path], tmp_path: Path, caplog: Any
) -> None:
    """Before: only the size was checked, so 4 MiB overwritten inside the file were loaded ("loaded from the saved
    model cache") and the tokens differed. Now the hash of the bytes is checked and the model rebuilt."""
    settings = _settings(compose_model, "deepseek_ocr_tiny", tmp_path)
    built, _ = _load(settings, caplog)
    weights = _slot(tmp_path) / saved_model.WEIGHTS_FILE
    size = weights.stat().st_size
    damage = min(4 << 20, size // 2)
    with weights.open("r+b") as handle:
        handle.seek(size - damage)  # the tensors' bytes, not the header
        handle.write(torch.randn(damage // 4, generator=torch.Generator().manual_seed(1)).numpy().tobytes())
    assert weights.stat().st_size == size
    session, said = _load(settings, caplog)
    assert "do not match its manifest's hash (damaged or overwritten)" in said and "building it" in said
    assert "loaded from the saved model cache" not in said
    page = page_images["small"]
    assert (
        session.run_image(page, NEW_TOKENS, nvtx=False).token_ids
        == built.run_image(page, NEW_TOKENS, nvtx=False).token_ids
    )
    _, said = _load(settings, caplog)  # saved again, whole
    assert "loaded from the saved model cache" in said


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """`folder` and what it holds read-only for this process: its modes (a user), or a read-only bind mount onto
    itself (root, whom modes do not stop; skipped where mounting is not allowed)."""
    if os.geteuid() != 0:
        folders = [folder, *(p for p in folder.rglob("*") if p.is_dir())]
        for each in folders:
            each.chmod(0o555)
        try:
            yield
        finally:
            for each in folders:
                each.chmod(0o755)
        return
    mount = ["mount", "--bind", str(folder), str(folder)]
    if subprocess.run(mount, capture_output=True, check=False).returncode != 0:
        pytest.skip("root, and no read-only bind mount allowed here: a read-only folder cannot be made")
    try:
        remount = ["mount", "-o", "remount,bind,ro", str(folder)]
        if subprocess.run(remount, capture_output=True, check=False).returncode != 0:
            pytest.skip("root, and no read-only remount allowed here: a read-only folder cannot be made")
        yield
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=True)  # the loaded tensors may map its file


def test_a_read_only_cache_is_loaded_and_one_that_needs_rebuilding_is_built(
    compose_model: Any, tmp_path: Path, caplog: Any
) -> None:
    """Before: a valid cache that could not be written failed the run with a raw OSError naming hydra.run.dir (its
    lock file needs write access)."""
    cache = tmp_path / "cache"
    settings = _settings(compose_model, "deepseek_ocr_tiny", cache)
    built, _ = _load(settings, caplog)
    slot = _slot(cache)
    for keep_lock in (True, False):
        if not keep_lock:
            (cache / f"{slot.name}{saved_model.LOCK_FILE}").unlink()
        with read_only(cache):
            session, said = _load(settings, caplog)
        assert "loaded from the saved model cache" in said
        assert all(torch.equal(t, _tensors(built.model)[k]) for k, t in _tensors(session.model).items())
    (slot / saved_model.MANIFEST_FILE).write_text("{")
    with read_only(cache):
        session, said = _load(settings, caplog)
    assert "could not be saved" in said and "model.cache_dir" in said
    assert all(torch.equal(t, _tensors(built.model)[k]) for k, t in _tensors(session.model).items())


def test_tensors_that_do_not_fit_the_model_are_refused(compose_model: Any) -> None:
    settings = _settings(compose_model, "deepseek_ocr2_tiny")
    skeleton = InferenceSession.load(settings, CPU).model
    tensors = saved_model.state_tensors(skeleton)
    name = next(iter(tensors))
    with pytest.raises(saved_model.SavedModelMismatch, match="not in the file"):
        saved_model.assign_tensors(skeleton, {k: v for k, v in tensors.items() if k != name})
    with pytest.raises(saved_model.SavedModelMismatch, match="in the file"):
        saved_model.assign_tensors(skeleton, {**tensors, name: torch.zeros(1)})


def test_another_seed_or_dtype_gets_its_own_slot(compose_model: Any, tmp_path: Path, caplog: Any) -> None:
    settings = _settings(compose_model, "deepseek_ocr_tiny", tmp_path)
    _load(settings, caplog)
    _load(attrs.evolve(settings, seed=1), caplog)
    _load(attrs.evolve(settings, dtype="bfloat16"), caplog)
    names = sorted(p.name.rsplit("-", 1)[0] for p in tmp_path.iterdir() if p.is_dir())
    assert names == [
        "deepseek_ocr_tiny-bfloat16-seed0-cpu",
        "deepseek_ocr_tiny-float32-seed0-cpu",
        "deepseek_ocr_tiny-float32-seed1-cpu",
    ]


def test_where_the_model_is_saved_changes_no_config_digest() -> None:
    cfg = compose_stage2("model=deepseek_ocr_tiny")
    assert config_digest(cfg) == config_digest(compose_stage2("model=deepseek_ocr_tiny", "model.cache_dir=/x"))
    assert config_digest(cfg) != config_digest(compose_stage2("model=deepseek_ocr_tiny", "model.seed=1"))


def test_stage2_child_commands_carry_the_run_model_cache(tmp_path: Path) -> None:
    cfg = compose_stage2("model=deepseek_ocr_tiny", "stage2.reuse_model=true")
    run = stage2_run(cfg, tmp_path, run_id="x", task_overrides=["model=deepseek_ocr_tiny"])
    assert run.model_cache == tmp_path / MODEL_CACHE_DIR
    for ncu in (False, True):
        argv = workload_argv(run.settings, run.user_overrides, tmp_path, name="w", ncu=ncu, model_cache=run.model_cache)
        assert quoted_override("model.cache_dir", tmp_path / MODEL_CACHE_DIR) in argv
    mine = ["model=deepseek_ocr_tiny", "model.cache_dir=/keep", "stage2.reuse_model=true"]  # the user's folder, as set
    assert stage2_run(compose_stage2(*mine), tmp_path, run_id="x", task_overrides=mine).model_cache is None
    off = compose_stage2("stage2.reuse_model=false")
    assert stage2_run(off, tmp_path, run_id="x", task_overrides=[]).model_cache is None
    assert stage2_run(compose_stage2(), tmp_path, run_id="x", task_overrides=[]).model_cache is None  # off by default
    checkpoint = compose_stage2(f"model.path={tmp_path}", "stage2.reuse_model=true")
    assert stage2_run(checkpoint, tmp_path, run_id="x", task_overrides=[]).model_cache is None
    argv = workload_argv(stage2_settings(cfg), [], tmp_path, name="w", model_cache=None)
    assert not any(a.startswith("model.cache_dir=") for a in argv)


def _whatif_caches(tmp_path: Path, *overrides: str) -> Any:
    cfg = compose_config("whatif", "model=deepseek_ocr_tiny", *overrides)
    return shared_caches(whatif_nodes(cfg).whatif_run, command_config(cfg).model, tmp_path)


def test_whatif_rung_commands_carry_the_model_cache_and_inductor_env(tmp_path: Path) -> None:
    caches = _whatif_caches(tmp_path, "whatif_run.inductor_cache=run", "whatif_run.reuse_model=true")
    assert caches.owned == (tmp_path / "model_cache", tmp_path / INDUCTOR_CACHE_DIR)
    job = RungJob(
        "baseline",
        ("model=deepseek_ocr_tiny",),
        ("runtime.kv_cache=static",),
        tmp_path / "rungs" / "00-baseline",
        tmp_path / "logs" / "00-baseline.log",
        shared=caches.overrides,
        env=caches.env,
    )
    command = stage1_command(job, None)
    cache_dir = quoted_override("model.cache_dir", tmp_path / "model_cache")
    assert cache_dir in command
    assert command.index("runtime.kv_cache=static") > command.index(cache_dir)
    env = child_env(job.env)
    assert env is not None and env[INDUCTOR_CACHE_ENV] == str(tmp_path / INDUCTOR_CACHE_DIR)
    assert env["PATH"]  # the rest of the environment is inherited
    phase = phase_command([job], [], tmp_path / "rung_configs", tmp_path / "rungs")
    assert cache_dir in phase
    for folder in caches.owned:
        (folder / "x").mkdir(parents=True)
    caches.remove()
    assert not any(folder.exists() for folder in caches.owned)


def test_whatif_caches_follow_their_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    default = _whatif_caches(tmp_path, "whatif_run.reuse_model=true")  # inductor: a per-user folder, kept
    assert default.env == ((INDUCTOR_CACHE_ENV, str(tmp_path / "xdg" / "llm_perf_opt" / "inductor")),)
    assert default.owned == (tmp_path / "model_cache",)
    off = _whatif_caches(tmp_path, "whatif_run.reuse_model=false", "whatif_run.inductor_cache=null")
    assert off.overrides == () and off.env == () and off.owned == () and child_env(off.env) is None
    kept = _whatif_caches(tmp_path, f"whatif_run.inductor_cache={tmp_path / 'kernels'}", "model.cache_dir=/keep")
    assert kept.overrides == () and kept.owned == ()  # the user's model.cache_dir reaches the rungs as a workload key
    assert kept.env == ((INDUCTOR_CACHE_ENV, str(tmp_path / "kernels")),)
