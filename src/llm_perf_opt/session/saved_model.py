"""Build once, reuse: a random-weights model saved as a local safetensors file by the first process of a run that
builds it, and loaded by the later ones (`model.cache_dir`; stage2-profile's and perf-whatif's child processes).

A slot `<cache_dir>/<model name>-<dtype>-seed<N>-<device type>-<config digest>/` holds `model.safetensors` (every
parameter and buffer, tied ones once) and `manifest.json` (:class:`SavedModelKey`, the file's size, a hash of its
bytes, the parameter count). A slot whose manifest matches this process's key and whose bytes match the hash is
assigned, straight onto the device, to the model built on the meta device: bit for bit what building gives.
Anything else is one log line saying why, then the model is built and saved over the slot (a lock file per slot:
processes that start together build it once). A read-only slot is still loaded when whole; one that would need
rebuilding is built for this process alone, with a warning.

The hash (`content_digest`): blake2b of `HASH_BLOCK`-byte blocks on parallel threads (hashlib releases the GIL),
then of their digests. On a 1 GB file in the page cache (shared 2-core CPU, load 7): 3.7 s on one thread (sha256
3.0 s; reading alone 0.8 s); spread over every core, seconds per several-GB file against minutes of building.

Random initialisation depends on where it ran (CPU and CUDA generators differ; a CUDA kernel's grid, and so the
values it draws, may depend on the GPU's SM count): the device type names the slot, the GPU's name is in the key.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import inspect
import json
import logging
import os
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import attrs
import torch
from torch import nn

import llm_perf_opt
from llm_perf_opt.errors import UserError
from llm_perf_opt.records.io import RecordError, load_file
from llm_perf_opt.records.io import save as save_record
from llm_perf_opt.records.saved_model import Manifest, SavedModelKey
from llm_perf_opt.session.adapters.base import LoadedModel, ModelAdapter

log = logging.getLogger("llm_perf_opt.saved_model")

WEIGHTS_FILE = "model.safetensors"
MANIFEST_FILE = "manifest.json"
LOCK_FILE = ".lock"
LOADED_NOTE = "loaded from the run's saved model cache"
HASH_BLOCK = 64 << 20  # bytes hashed per thread step (content_digest)
HASH_NAME = "blake2b-64MiB-blocks"


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def content_digest(path: Path) -> str:
    """A hash of the bytes of `path`: blake2b of each HASH_BLOCK-byte block (in parallel), then of their digests."""
    size = path.stat().st_size
    blocks = max(1, -(-size // HASH_BLOCK))

    def block(index: int) -> bytes:
        with path.open("rb", buffering=0) as handle:
            handle.seek(index * HASH_BLOCK)
            return hashlib.blake2b(handle.read(HASH_BLOCK), digest_size=32).digest()

    with ThreadPoolExecutor(max_workers=min(blocks, os.cpu_count() or 1)) as pool:
        digests = b"".join(pool.map(block, range(blocks)))
    return f"{HASH_NAME}:{hashlib.blake2b(digests, digest_size=32).hexdigest()}"


def config_digest(model: nn.Module) -> str:
    """sha256 of the model's config as a sorted JSON text (its `to_dict()`; the class name without a config)."""
    config = getattr(model, "config", None)
    data = config.to_dict() if config is not None and hasattr(config, "to_dict") else {}
    return _digest(json.dumps(data, sort_keys=True, default=str))


def source_digest(model: nn.Module) -> str:
    """sha256 of the file that defines the model's class ("" when it cannot be read)."""
    try:
        path = inspect.getsourcefile(type(model))
        return _digest(Path(path).read_text(encoding="utf-8")) if path else ""
    except (OSError, TypeError):
        return ""


def model_key(adapter: ModelAdapter, skeleton: nn.Module, dtype: torch.dtype, device: torch.device) -> SavedModelKey:
    """The key of the model `adapter` builds (`skeleton`: the same model on the meta device) on `device`."""
    import transformers

    cls = type(skeleton)
    return SavedModelKey(
        model=adapter.settings.name,
        adapter=adapter.settings.adapter,
        model_class=f"{cls.__module__}.{cls.__qualname__}",
        config_digest=config_digest(skeleton),
        source_digest=source_digest(skeleton),
        dtype=str(dtype).removeprefix("torch."),
        seed=adapter.settings.seed,
        init_device=init_device(device),
        torch=torch.__version__,
        transformers=transformers.__version__,
        llm_perf_opt=llm_perf_opt.__version__,
    )


def init_device(device: torch.device) -> str:
    """`cpu`, or `cuda:<GPU name>` (the values a CUDA generator draws may depend on the GPU)."""
    if device.type != "cuda":
        return device.type
    return f"cuda:{torch.cuda.get_device_name(device)}"


def slot_folder(cache_dir: Path, key: SavedModelKey) -> Path:
    """Where the model of `key` is saved under `cache_dir` (rungs of other configs do not share it)."""
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in key.model) or "model"
    config = key.config_digest.removeprefix("sha256:")[:12]
    device = key.init_device.split(":", 1)[0]
    return cache_dir / f"{name}-{key.dtype}-seed{key.seed}-{device}-{config}"


def tensor_slots(model: nn.Module) -> dict[str, list[tuple[nn.Module, str, bool]]]:
    """Every place (module, attribute, is a parameter) of each parameter and buffer of `model`, by the name it is
    saved under (the first of its tied names)."""
    owners = {name: module for name, module in model.named_modules(remove_duplicate=False)}
    slots: dict[str, list[tuple[nn.Module, str, bool]]] = {}
    canonical: dict[int, str] = {}
    named: list[tuple[str, torch.Tensor, bool]] = [
        (n, t, True) for n, t in model.named_parameters(remove_duplicate=False)
    ]
    named += [(n, t, False) for n, t in model.named_buffers(remove_duplicate=False)]
    for name, tensor, is_param in named:
        owner, _, leaf = name.rpartition(".")
        first = canonical.setdefault(id(tensor), name)
        slots.setdefault(first, []).append((owners[owner], leaf, is_param))
    return slots


def state_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors to save: every parameter and buffer once, under its first name, contiguous."""
    slots = tensor_slots(model)
    flat = {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers(remove_duplicate=False))}
    return {name: flat[name].detach().contiguous() for name in slots}


def save(folder: Path, model: nn.Module, key: SavedModelKey) -> Manifest:
    """Write `model`'s tensors and manifest into `folder` (each file written aside, then renamed into place)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = state_tensors(model)
    weights, manifest_path = folder / WEIGHTS_FILE, folder / MANIFEST_FILE
    manifest_path.unlink(missing_ok=True)  # no manifest while the weights change
    partial = folder / f"{WEIGHTS_FILE}.partial-{os.getpid()}"
    try:
        save_file(tensors, str(partial), metadata={"key": json.dumps(attrs.asdict(key), sort_keys=True)})
        digest = content_digest(partial)
        os.replace(partial, weights)
    finally:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)  # left only when writing failed (full disk)
    manifest = Manifest(
        key=key,
        parameters=sum(p.numel() for p in model.parameters()),
        tensors=len(tensors),
        file_bytes=weights.stat().st_size,
        content_digest=digest,
    )
    save_record(manifest, manifest_path)  # written aside, then renamed
    return manifest


def read_manifest(folder: Path, key: SavedModelKey) -> tuple[Manifest | None, str]:
    """The slot's manifest when it matches `key` and its weights file is whole, else None and why not."""
    weights, manifest_path = folder / WEIGHTS_FILE, folder / MANIFEST_FILE
    if not manifest_path.is_file():
        return None, "no saved model yet" if not weights.exists() else "its manifest.json is missing"
    try:
        manifest = load_file(manifest_path, Manifest, versioned=False)
    except RecordError as exc:
        return None, f"its {MANIFEST_FILE} cannot be read ({exc.problem.split(': ', 1)[-1]})"
    if (difference := key.describe_difference(attrs.asdict(manifest.key))) is not None:
        return None, f"it was saved for another model: {difference}"
    size = weights.stat().st_size if weights.is_file() else None
    if size != manifest.file_bytes:
        found = "missing" if size is None else f"{size} bytes"
        return None, f"{WEIGHTS_FILE} is {found}, its manifest says {manifest.file_bytes} bytes (truncated or replaced)"
    if not manifest.content_digest:
        return None, f"its {MANIFEST_FILE} records no hash of the weights (saved by an older version)"
    started = time.perf_counter()
    try:
        digest = content_digest(weights)
    except OSError as exc:
        return None, f"{WEIGHTS_FILE} cannot be read ({exc.strerror or exc})"
    if digest != manifest.content_digest:
        return None, f"the bytes of {WEIGHTS_FILE} do not match its manifest's hash (damaged or overwritten)"
    log.debug("checked the hash of %s (%.2f GB) in %.2f s", weights, size / 1e9, time.perf_counter() - started)
    return manifest, ""


class SavedModelMismatch(ValueError):
    """The saved tensors do not fit the model built now (the message says which)."""


def assign_tensors(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Put `tensors` (by saved name) in place of `model`'s meta-device parameters and buffers, tied places sharing
    one tensor; SavedModelMismatch when a name is missing or extra, or a shape or dtype differs."""
    slots = tensor_slots(model)
    check_names(slots, tensors)
    for name, places in slots.items():
        module, leaf, is_param = places[0]
        old = module._parameters[leaf] if is_param else module._buffers[leaf]
        new = tensors[name]
        assert old is not None
        if old.shape != new.shape or old.dtype != new.dtype:
            raise SavedModelMismatch(
                f"{name} is {tuple(new.shape)} {new.dtype} in the file, {tuple(old.shape)} {old.dtype} in the model"
            )
        value: torch.Tensor = nn.Parameter(new, requires_grad=old.requires_grad) if is_param else new
        for module, leaf, param in places:
            if param:
                module._parameters[leaf] = value  # type: ignore[assignment]
            else:
                module._buffers[leaf] = value
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise SavedModelMismatch(f"{len(left)} tensor(s) stayed on the meta device, e.g. {left[0]}")


_READ_ONLY = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


@contextlib.contextmanager
def slot_lock(folder: Path) -> Iterator[None]:
    """Hold the slot's lock file (processes that start together build and save it once); in a cache this process
    cannot write, the lock file is taken read-only where it exists, else none is needed."""
    lock = folder.parent / f"{folder.name}{LOCK_FILE}"
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        handle = lock.open("a")
    except OSError as exc:
        if exc.errno not in _READ_ONLY:
            raise
        if not lock.is_file():
            yield
            return
        handle = lock.open("r")
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_tensors(path: Path, model: nn.Module, device: torch.device) -> dict[str, torch.Tensor]:
    """The saved tensors of `model`, read onto `device` in the order building allocates them (parameters, then
    buffers); SavedModelMismatch unless the file holds exactly the model's."""
    from safetensors import safe_open

    wanted = list(tensor_slots(model))
    with safe_open(str(path), framework="pt", device=str(device)) as saved:
        check_names(wanted, saved.keys())
        return {name: saved.get_tensor(name) for name in wanted}


def check_names(wanted: Iterable[str], saved: Iterable[str]) -> None:
    """SavedModelMismatch unless the saved names are the model's tensor names."""
    want, have = set(wanted), set(saved)
    if missing := sorted(want - have):
        raise SavedModelMismatch(f"{len(missing)} tensor(s) of the model are not in the file, e.g. {missing[0]}")
    if extra := sorted(have - want):
        raise SavedModelMismatch(f"the file holds {len(extra)} tensor(s) the model has not, e.g. {extra[0]}")


def load_saved(folder: Path, key: SavedModelKey, skeleton: LoadedModel, device: torch.device) -> LoadedModel | str:
    """`skeleton` (the model on the meta device) with the slot's tensors loaded onto `device`, or why not."""
    from safetensors import SafetensorError

    manifest, why = read_manifest(folder, key)
    if manifest is None:
        return why
    try:
        tensors = read_tensors(folder / WEIGHTS_FILE, skeleton.model, device)
        assign_tensors(skeleton.model, tensors)
    except (SafetensorError, OSError, RuntimeError, SavedModelMismatch) as exc:
        return f"{WEIGHTS_FILE} cannot be loaded ({type(exc).__name__}: {exc})"
    parameters = sum(p.numel() for p in skeleton.model.parameters())
    if parameters != manifest.parameters:
        return f"it holds {manifest.parameters} parameters, the model has {parameters}"
    return attrs.evolve(
        skeleton, model=skeleton.model.eval(), weights_detail=f"{skeleton.weights_detail}; {LOADED_NOTE} {folder}"
    )


def load_or_build(adapter: ModelAdapter, *, device: torch.device, dtype: torch.dtype, cache_dir: Path) -> LoadedModel:
    """The random-weights model `adapter` builds, loaded from its slot under `cache_dir`, else built and saved."""
    try:
        skeleton = adapter.build_random(device=torch.device("meta"), dtype=dtype)
    except (RuntimeError, NotImplementedError, TypeError, ValueError, AttributeError) as exc:
        log.info("model cache not used: the model cannot be built on the meta device (%s: %s)", type(exc).__name__, exc)
        return adapter.build_random(device=device, dtype=dtype)
    key = model_key(adapter, skeleton.model, dtype, device)
    folder = slot_folder(Path(cache_dir).expanduser(), key)
    try:
        with slot_lock(folder):
            loaded = load_saved(folder, key, skeleton, device)
            if isinstance(loaded, LoadedModel):
                log.info("model loaded from the saved model cache %s (not built)", folder)
                return loaded
            log.info("saved model in %s not used: %s; building it and saving it there", folder, loaded)
            del skeleton
            built = adapter.build_random(device=device, dtype=dtype)
            try:
                manifest = save(folder, built.model, key)
            except OSError as exc:
                if exc.errno not in _READ_ONLY and exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                log.warning(
                    "the model could not be saved to %s (%s): it was built for this process only; point "
                    "model.cache_dir at a writable folder with room to reuse it",
                    folder,
                    exc.strerror or exc,
                )
                return built
    except OSError as exc:
        raise UserError(
            f"the saved model cache {folder} cannot be written: {exc.strerror or exc}",
            "Point model.cache_dir at a writable folder with room, or set model.cache_dir=null to build the model "
            "in every process",
        ) from exc
    log.info("saved the model to %s (%.2f GB) for the run's next processes", folder, manifest.file_bytes / 1e9)
    return attrs.evolve(built, weights_detail=f"{built.weights_detail}; saved to the run's model cache {folder}")
