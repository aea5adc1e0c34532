"""Find nsys/ncu, run them as subprocesses with a log and a timeout, and turn their failures into UserErrors."""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from llm_perf_opt.errors import UserError

TOOL_NAMES = ("nsys", "ncu")
_PRODUCT = {"nsys": "Nsight Systems", "ncu": "Nsight Compute"}
_CONFIG_KEY = {"nsys": "pipeline.nsys", "ncu": "pipeline.ncu"}

# Install folders searched after PATH, in this order; within one pattern the newest version comes first.
# `{extern}` stands for the project's extern/ folder (the current directory's and the checkout's).
SEARCH_GLOBS: dict[str, tuple[str, ...]] = {
    "nsys": (
        "{extern}",
        "{extern}/*",
        "{extern}/*/bin",
        "{extern}/*/target-linux-x64",
        "/usr/local/cuda/bin",
        "/usr/local/cuda-*/bin",
        "/opt/nvidia/nsight-systems/*/bin",
        "/opt/nvidia/nsight-systems/*/target-linux-x64",
        "/usr/local/cuda*/nsight-systems-*/bin",
        "/usr/lib/nsight-systems/bin",
        "/usr/lib/nsight-systems/target-linux-x64",
        # Nsight Compute bundles an nsys whose QdstrmImporter may lack libdw: last resort.
        "/opt/nvidia/nsight-compute/*/host/target-linux-x64",
    ),
    "ncu": (
        "{extern}",
        "{extern}/*",
        "{extern}/*/bin",
        "/usr/local/cuda/bin",
        "/usr/local/cuda-*/bin",
        "/opt/nvidia/nsight-compute/*",
        "/usr/local/cuda*/nsight-compute-*",
        "/usr/lib/nsight-compute",
    ),
}

_VERSION_RE = re.compile(r"version\s+v?(\d+(?:\.\d+)+)", re.IGNORECASE)
_PERM_TOKEN = b"ERR_NVGPUCTRPERM"
_PERM_URL = "https://developer.nvidia.com/ERR_NVGPUCTRPERM"
_TAIL_LINES = 30
_TERM_GRACE_S = 10.0


@attrs.frozen
class Tool:
    """A located Nsight command-line tool."""

    name: str  # "nsys" | "ncu"
    path: Path
    version: str


@attrs.frozen
class ToolRun:
    """One finished (or stopped) tool invocation; its stdout and stderr are in `log_path`."""

    argv: tuple[str, ...]
    returncode: int
    seconds: float
    log_path: Path
    timed_out: bool


# ---- discovery ---------------------------------------------------------------------------------------


def find_tool(
    name: str, configured: str | os.PathLike[str] | None = None, *, search_globs: Sequence[str] | None = None
) -> Tool:
    """Locate `name` ("nsys" or "ncu"): the configured path (file or folder) wins, then PATH, then install folders;
    `search_globs` replaces the default install-folder patterns (:data:`SEARCH_GLOBS`; tests use it)."""
    if name not in TOOL_NAMES:
        raise ValueError(f"unknown tool {name!r}; expected one of {TOOL_NAMES}")
    if configured is not None and str(configured).strip():
        return _tool_at(name, _configured_path(name, Path(str(configured)).expanduser()))
    if on_path := shutil.which(name):
        return _tool_at(name, Path(on_path))
    patterns = _expand_patterns(SEARCH_GLOBS[name] if search_globs is None else search_globs)
    for folder in _candidate_dirs(patterns):
        candidate = folder / name
        if _is_executable(candidate):
            return _tool_at(name, candidate)
    product, key = _PRODUCT[name], _CONFIG_KEY[name]
    raise UserError(
        f"{product} (`{name}`) was not found: not on PATH and not in {', '.join(patterns)}",
        f"Install {product} (or the CUDA toolkit that ships it), or set {key}.binary=/path/to/{name} (the file or "
        f"its folder), or link the install under extern/ (e.g. `ln -s /opt/nvidia/{product.lower().replace(' ', '-')}"
        f"/<version> extern/{name}`)",
    )


def _configured_path(name: str, path: Path) -> Path:
    key = f"{_CONFIG_KEY[name]}.binary"
    if not path.exists():
        raise UserError(
            f"{key}={path} does not exist",
            f"Point {key} at the `{name}` executable or its folder, "
            f"or set {key}=null to search PATH and the usual install folders",
        )
    if path.is_dir():
        for candidate in (path / name, path / "bin" / name):
            if _is_executable(candidate):
                return candidate
        raise UserError(
            f"{key}={path} is a folder without an executable `{name}` (looked at {path / name} and "
            f"{path / 'bin' / name})",
            f"Point {key} at the `{name}` executable or the folder holding it",
        )
    if not _is_executable(path):
        raise UserError(
            f"{key}={path} is not an executable file",
            f"Point {key} at the `{name}` executable (check its permissions: chmod +x)",
        )
    return path


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _extern_dirs() -> list[Path]:
    roots = [Path.cwd()]
    checkout = Path(__file__).resolve().parents[3]
    if (checkout / "pyproject.toml").is_file():
        roots.append(checkout)
    return list(dict.fromkeys((root / "extern").resolve() for root in roots))


def _expand_patterns(patterns: Sequence[str]) -> list[str]:
    expanded: list[str] = []
    for pattern in patterns:
        if "{extern}" in pattern:
            expanded.extend(pattern.replace("{extern}", str(d)) for d in _extern_dirs())
        else:
            expanded.append(pattern)
    return expanded


def _natural_key(text: str) -> list[tuple[int, int | str]]:
    """Sort key that orders `cuda-12.10` after `cuda-12.9` (numbers compare as numbers)."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", text) if part]


def _candidate_dirs(patterns: Sequence[str]) -> list[Path]:
    dirs: list[Path] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern), key=_natural_key, reverse=True)
        dirs.extend(Path(m) for m in matches if Path(m).is_dir())
    return dirs


def _tool_at(name: str, path: Path) -> Tool:
    return Tool(name=name, path=path, version=tool_version(name, path))


def tool_version(name: str, path: Path) -> str:
    """The version `<path> --version` reports ("2025.3.1.0"), or its first line when it has no version number."""
    product = _PRODUCT.get(name, name)
    try:
        done = subprocess.run(
            [str(path), "--version"], capture_output=True, text=True, timeout=120, check=False, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(
            f"Found {product} at {path}, but `{path} --version` failed: {exc}",
            f"Check that {path} is a working {product} install (reinstall it), or set "
            f"{_CONFIG_KEY.get(name, name)}.binary to another one",
        ) from exc
    output = (done.stdout or "") + (done.stderr or "")
    if done.returncode != 0:
        tail = "\n".join(output.strip().splitlines()[-_TAIL_LINES:])
        raise UserError(
            f"Found {product} at {path}, but `{path} --version` exited with {done.returncode}:\n{tail}",
            f"Check that {path} is a working {product} install (missing libraries are the usual cause), "
            f"or set {_CONFIG_KEY.get(name, name)}.binary to another one",
        )
    if match := _VERSION_RE.search(output):
        return match.group(1)
    return next((line.strip() for line in output.splitlines() if line.strip()), "unknown")


# ---- running -----------------------------------------------------------------------------------------


def run_tool(
    argv: Sequence[str],
    *,
    timeout_s: float,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> ToolRun:
    """Run `argv` with stdout and stderr streamed into `log_path`; stop its whole process group after `timeout_s`.
    `env` is the complete environment of the child (None: inherit this process's). The child runs in a new session,
    so a timeout (or Ctrl-C here) also stops the workload processes that nsys/ncu launched."""
    args = tuple(str(a) for a in argv)
    if not args:
        raise ValueError("run_tool needs a command")
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    timed_out = False
    with log_path.open("wb") as log:
        try:
            proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=None if env is None else dict(env),
                cwd=cwd,
                start_new_session=True,
            )
        except OSError as exc:
            raise UserError(
                f"Could not start `{args[0]}`: {exc}", "Check that the tool path exists and is executable"
            ) from exc
        try:
            returncode = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            returncode = _stop_group(proc)
        except BaseException:
            _stop_group(proc)
            raise
    return ToolRun(
        argv=args, returncode=returncode, seconds=time.monotonic() - started, log_path=log_path, timed_out=timed_out
    )


def _stop_group(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM the child's process group, SIGKILL it after a grace period; the child's exit status."""
    for sig, grace in ((signal.SIGTERM, _TERM_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break  # the group is gone already
        try:
            return proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


def log_tail(log_path: Path, lines: int = _TAIL_LINES) -> str:
    """The last `lines` lines of a (possibly large) log, read from its end."""
    try:
        with Path(log_path).open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
    kept = [line[:400] for line in text.split("\n") if line.strip()]
    return "\n".join(kept[-lines:])


def _log_contains(log_path: Path, token: bytes) -> bool:
    """Whether `token` occurs in the log (scanned in chunks; logs can be large)."""
    try:
        with Path(log_path).open("rb") as fh:
            previous = b""
            while chunk := fh.read(1 << 20):
                if token in previous[-len(token) :] + chunk:
                    return True
                previous = chunk
    except OSError:
        return False
    return False


def check_run(run: ToolRun, what: str) -> None:
    """Raise a UserError when `run` timed out, exited non-zero, or lacked GPU counter permission."""
    if _log_contains(run.log_path, _PERM_TOKEN):
        raise UserError(
            f"{what}: ERR_NVGPUCTRPERM, this user may not read the GPU performance counters (log: {run.log_path})",
            "Run as root, or allow profiling for all users: put `options nvidia NVreg_RestrictProfilingToAdminUsers=0` "
            "in a file under /etc/modprobe.d/ and reload the driver (or reboot); in a container add "
            f"`--cap-add SYS_ADMIN` (docker run); details: {_PERM_URL}",
        )
    if run.timed_out:
        tool = Path(run.argv[0]).name if run.argv else ""
        key = next((f"{_CONFIG_KEY[name]}.timeout_s" for name in TOOL_NAMES if tool.startswith(name)), None)
        budget = f"raise {key}" if key else "raise the time budget"
        raise UserError(
            f"{what} did not finish in time and was stopped after {run.seconds:.0f} s (log: {run.log_path}); "
            f"last lines:\n{log_tail(run.log_path)}",
            f"{budget.capitalize()}, or profile less work (fewer images, fewer new tokens, fewer kernels)",
        )
    if run.returncode != 0:
        if run.returncode < 0:
            try:
                how = f"was killed by {signal.Signals(-run.returncode).name}"
            except ValueError:
                how = f"was killed by signal {-run.returncode}"
        else:
            how = f"failed with exit code {run.returncode}"
        raise UserError(
            f"{what} {how} (log: {run.log_path}); last lines:\n{log_tail(run.log_path)}",
            "Read the log for the cause; the command is in cmd.txt next to it and can be rerun by hand",
        )


def check_nsys_report(output_base: Path, *, log_path: Path | None = None) -> Path:
    """The `.nsys-rep` that `nsys profile -o <output_base>` wrote, or a UserError saying why there is none."""
    base = Path(output_base)
    if base.suffix in (".nsys-rep", ".qdstrm"):
        base = base.with_suffix("")
    report = base.with_name(base.name + ".nsys-rep")
    if report.is_file():
        return report
    see = f" (see {log_path})" if log_path is not None else " (see the nsys log)"
    qdstrm = base.with_name(base.name + ".qdstrm")
    strays = [qdstrm] if qdstrm.is_file() else sorted(base.parent.glob("*.qdstrm"))
    if strays:
        raw = strays[0]
        raise UserError(
            f"nsys left the raw capture {raw} but no {report.name}{see}: its QdstrmImporter could not convert the "
            "capture, commonly because libdw.so.1 is missing (seen with the nsys bundled in Nsight Compute)",
            "Install libdw (Debian/Ubuntu: `apt-get install libdw1`; RHEL/Fedora: `dnf install elfutils-libs`) or "
            "use a full Nsight Systems install (pipeline.nsys.binary), then rerun; to convert this capture by hand "
            f"run `QdstrmImporter -i {raw}` (QdstrmImporter lies next to nsys, e.g. in host-linux-x64/)",
        )
    raise UserError(
        f"nsys wrote no report: {report} is missing{see}",
        "Read the nsys log: the workload may have failed before any CUDA work, or the NVTX capture range never "
        "opened (check pipeline.nsys.capture_range)",
    )


# ---- GPU -------------------------------------------------------------------------------------------------


def has_cuda_gpu() -> bool:
    """Whether torch sees a CUDA GPU."""
    import torch

    return bool(torch.cuda.is_available())


def require_gpu() -> None:
    """Raise a UserError unless a CUDA GPU is visible (Stage 2 has nothing to profile without one)."""
    if has_cuda_gpu():
        return
    import torch

    why = "torch is a CPU-only build" if torch.version.cuda is None else "torch.cuda.is_available() is False"
    raise UserError(
        f"Stage 2 profiles GPU work: no CUDA GPU visible ({why})",
        "Run on a machine with an NVIDIA GPU, its driver and a CUDA build of torch; check `nvidia-smi` and "
        "CUDA_VISIBLE_DEVICES",
    )
