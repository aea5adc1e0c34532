"""Finding nsys/ncu, running tools with logs and timeouts, and the errors a user can act on."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from llm_perf_opt.errors import UserError
from llm_perf_opt.nsight import tools
from llm_perf_opt.nsight.tools import ToolRun, check_nsys_report, check_run, find_tool, run_tool

NSYS_VERSION = "NVIDIA Nsight Systems version 2025.3.1.0-253137718598v0"
NCU_VERSION = (
    "NVIDIA (R) Nsight Compute Command Line Profiler\nCopyright (c) 2018-2025 NVIDIA Corporation\n"
    "Version 2025.3.1.0 (build 36398880) (public-release)"
)


def fake_tool(folder: Path, name: str, output: str, exit_code: int = 0) -> Path:
    """An executable shell script `folder/name` that prints `output` and exits with `exit_code`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    body = "\n".join(f"echo '{line}'" for line in output.splitlines())
    path.write_text(f"#!/bin/sh\n{body}\nexit {exit_code}\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def empty_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH holding only an empty folder; no default install folders searched."""
    folder = tmp_path / "empty-bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", str(folder))
    monkeypatch.setattr(tools, "SEARCH_GLOBS", {"nsys": (), "ncu": ()})
    return folder


# ---- discovery ---------------------------------------------------------------------------------------


def test_find_tool_on_path(tmp_path: Path, empty_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nsys = fake_tool(tmp_path / "bin", "nsys", NSYS_VERSION)
    ncu = fake_tool(tmp_path / "bin", "ncu", NCU_VERSION)
    monkeypatch.setenv("PATH", f"{empty_path}{os.pathsep}{tmp_path / 'bin'}")
    found = find_tool("nsys")
    assert (found.name, found.path, found.version) == ("nsys", nsys, "2025.3.1.0")
    found_ncu = find_tool("ncu")
    assert (found_ncu.path, found_ncu.version) == (ncu, "2025.3.1.0")


def test_configured_file_and_folder_win_over_path(
    tmp_path: Path, empty_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_tool(tmp_path / "path-bin", "nsys", "NVIDIA Nsight Systems version 2024.1.1.1")
    monkeypatch.setenv("PATH", str(tmp_path / "path-bin"))
    configured = fake_tool(tmp_path / "mine", "nsys", NSYS_VERSION)
    assert find_tool("nsys", str(configured)).path == configured
    assert find_tool("nsys", str(configured.parent)).version == "2025.3.1.0"
    under_bin = fake_tool(tmp_path / "install" / "bin", "nsys", NSYS_VERSION)
    assert find_tool("nsys", str(tmp_path / "install")).path == under_bin
    assert find_tool("nsys", None).version == "2024.1.1.1"
    assert find_tool("nsys", "").version == "2024.1.1.1"


def test_configured_path_errors(tmp_path: Path, empty_path: Path) -> None:
    with pytest.raises(UserError, match=r"pipeline\.ncu\.binary=.*does not exist"):
        find_tool("ncu", str(tmp_path / "nope" / "ncu"))
    (tmp_path / "folder").mkdir()
    with pytest.raises(UserError, match="folder without an executable `ncu`"):
        find_tool("ncu", str(tmp_path / "folder"))
    plain = tmp_path / "ncu"
    plain.write_text("not executable")
    with pytest.raises(UserError, match="not an executable file"):
        find_tool("ncu", str(plain))


def test_missing_tool_names_where_it_looked_and_the_fix(tmp_path: Path, empty_path: Path) -> None:
    pattern = str(tmp_path / "opt" / "nsight-systems" / "*" / "bin")
    with pytest.raises(UserError) as err:
        find_tool("nsys", search_globs=[pattern])
    text = str(err.value)
    assert "Nsight Systems (`nsys`) was not found" in text
    assert pattern in text and "PATH" in text
    assert "pipeline.nsys.binary" in text and "extern/" in text and "Install Nsight Systems" in text
    with pytest.raises(UserError, match=r"Install Nsight Compute.*pipeline\.ncu\.binary"):
        find_tool("ncu")
    with pytest.raises(ValueError):
        find_tool("nvprof")


def test_install_folders_newest_version_first(tmp_path: Path, empty_path: Path) -> None:
    root = tmp_path / "opt" / "nvidia" / "nsight-systems"
    fake_tool(root / "2024.6.1" / "bin", "nsys", "NVIDIA Nsight Systems version 2024.6.1.90")
    newest = fake_tool(root / "2025.3.1" / "bin", "nsys", NSYS_VERSION)
    cuda = tmp_path / "usr" / "local"
    fake_tool(cuda / "cuda-12.9" / "bin", "ncu", "Version 2025.1.0.0 (build 1)")
    cuda_newest = fake_tool(cuda / "cuda-12.10" / "bin", "ncu", "Version 2025.2.0.0 (build 2)")
    assert find_tool("nsys", search_globs=[str(tmp_path / "none" / "*"), str(root / "*" / "bin")]).path == newest
    found = find_tool("ncu", search_globs=[str(cuda / "cuda-*" / "bin")])
    assert (found.path, found.version) == (cuda_newest, "2025.2.0.0")


def test_default_globs_cover_the_usual_folders() -> None:
    nsys, ncu = tools.SEARCH_GLOBS["nsys"], tools.SEARCH_GLOBS["ncu"]
    for folder in (
        "/usr/local/cuda/bin",
        "/usr/local/cuda-*/bin",
        "/opt/nvidia/nsight-systems/*/bin",
        "/opt/nvidia/nsight-systems/*/target-linux-x64",
        "/usr/lib/nsight-systems/bin",
    ):
        assert folder in nsys
    assert nsys[-1] == "/opt/nvidia/nsight-compute/*/host/target-linux-x64"  # the bundled nsys comes last
    assert "/opt/nvidia/nsight-compute/*" in ncu and "{extern}" in ncu


def test_extern_folder_is_searched(tmp_path: Path, empty_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    linked = fake_tool(tmp_path / "extern" / "nsight-compute", "ncu", NCU_VERSION)
    found = find_tool("ncu", search_globs=["{extern}/*"])
    assert found.path.resolve() == linked.resolve()


def test_broken_tool_version_is_a_user_error(tmp_path: Path, empty_path: Path) -> None:
    broken = fake_tool(tmp_path / "b", "nsys", "error while loading shared libraries: libdw.so.1", exit_code=127)
    with pytest.raises(UserError, match=r"(?s)--version` exited with 127.*libdw\.so\.1"):
        find_tool("nsys", str(broken))
    odd = fake_tool(tmp_path / "o", "nsys", "some build without a number")
    assert find_tool("nsys", str(odd)).version == "some build without a number"


# ---- running -----------------------------------------------------------------------------------------


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_run_tool_streams_output_to_log(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "run.log"
    run = run_tool(py("import sys; print('out'); print('err', file=sys.stderr)"), timeout_s=60, log_path=log)
    assert run.returncode == 0 and not run.timed_out and run.seconds >= 0
    assert run.argv[0] == sys.executable and run.log_path == log
    assert set(log.read_text().split()) == {"out", "err"}
    check_run(run, "fake tool")


def test_run_tool_env_and_cwd(tmp_path: Path) -> None:
    env = {"PATH": os.environ.get("PATH", ""), "LLO_FAKE": "yes"}
    run = run_tool(
        py("import os; print(os.environ['LLO_FAKE'], os.getcwd())"),
        timeout_s=60,
        log_path=tmp_path / "env.log",
        env=env,
        cwd=tmp_path,
    )
    assert run.returncode == 0
    assert run.log_path.read_text().split() == ["yes", str(tmp_path)]


def test_failing_tool_error_has_the_log_tail(tmp_path: Path) -> None:
    run = run_tool(
        py("import sys\nfor i in range(100): print(f'line {i}')\nsys.exit(3)"),
        timeout_s=60,
        log_path=tmp_path / "fail.log",
    )
    assert run.returncode == 3 and not run.timed_out
    with pytest.raises(UserError) as err:
        check_run(run, "Nsight Compute (decode)")
    text = str(err.value)
    assert "Nsight Compute (decode) failed with exit code 3" in text and str(run.log_path) in text
    assert "line 99" in text and "line 70" in text and "line 69\n" not in text
    assert "cmd.txt" in text


def test_timeout_kills_the_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(120)\n"
    )
    started = time.monotonic()
    run = run_tool(py(code), timeout_s=2, log_path=tmp_path / "slow.log")
    assert run.timed_out and time.monotonic() - started < 30
    assert run.returncode == -signal.SIGTERM
    child = int(pid_file.read_text())
    assert _gone(child), "the workload's own child survived the timeout"
    with pytest.raises(UserError, match="did not finish in time"):
        check_run(run, "fake tool")


def _gone(pid: int, wait_s: float = 10.0) -> bool:
    """Whether `pid` has exited (a zombie waiting for its reaper counts as exited)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize(("tool", "key"), [("/x/ncu", "pipeline.ncu.timeout_s"), ("nsys", "pipeline.nsys.timeout_s")])
def test_timeout_error_names_the_budget(tmp_path: Path, tool: str, key: str) -> None:
    log = tmp_path / "t.log"
    log.write_text('==PROF== Profiling "gemv"\n')
    run = ToolRun(argv=(tool, "profile"), returncode=-15, seconds=900.2, log_path=log, timed_out=True)
    with pytest.raises(UserError) as err:
        check_run(run, "profile")
    assert f"Raise {key}" in str(err.value) and "900 s" in str(err.value) and "Profiling" in str(err.value)


def test_counter_permission_error_explains_the_fix(tmp_path: Path) -> None:
    message = (
        "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance "
        "Counters on the target device 0."
    )
    run = run_tool(py(f"print('x' * 3000); print({message!r})"), timeout_s=60, log_path=tmp_path / "perm.log")
    assert run.returncode == 0  # ncu may exit 0 after profiling nothing
    with pytest.raises(UserError) as err:
        check_run(run, "Nsight Compute (decode)")
    text = str(err.value)
    assert "performance counters" in text and "root" in text and "--cap-add SYS_ADMIN" in text
    assert "NVreg_RestrictProfilingToAdminUsers=0" in text and "https://developer.nvidia.com/ERR_NVGPUCTRPERM" in text


def test_signal_death_is_reported(tmp_path: Path) -> None:
    run = run_tool(
        py("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"), timeout_s=60, log_path=tmp_path / "k.log"
    )
    assert run.returncode == -signal.SIGKILL
    with pytest.raises(UserError, match="was killed by SIGKILL"):
        check_run(run, "nsys profile")


def test_missing_executable_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="Could not start"):
        run_tool([str(tmp_path / "no-such-tool")], timeout_s=5, log_path=tmp_path / "x.log")


def test_log_tail_reads_the_end(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    log.write_text("".join(f"row {i}\n" for i in range(50_000)) + "progress 10%\rprogress 100%\n")
    tail = tools.log_tail(log, lines=3)
    assert tail.splitlines() == ["row 49999", "progress 10%", "progress 100%"]
    assert tools.log_tail(tmp_path / "missing.log") == ""


# ---- nsys report -------------------------------------------------------------------------------------


def test_check_nsys_report_found(tmp_path: Path) -> None:
    rep = tmp_path / "report.nsys-rep"
    rep.write_bytes(b"rep")
    assert check_nsys_report(tmp_path / "report") == rep
    assert check_nsys_report(rep) == rep


def test_only_qdstrm_means_the_importer_failed(tmp_path: Path) -> None:
    (tmp_path / "report.qdstrm").write_bytes(b"raw")
    with pytest.raises(UserError) as err:
        check_nsys_report(tmp_path / "report", log_path=tmp_path / "profile.log")
    text = str(err.value)
    assert "libdw.so.1" in text and "libdw1" in text and "elfutils-libs" in text
    assert f"QdstrmImporter -i {tmp_path / 'report.qdstrm'}" in text and "profile.log" in text


def test_stray_qdstrm_in_the_folder(tmp_path: Path) -> None:
    (tmp_path / "report_0001.qdstrm").write_bytes(b"raw")
    with pytest.raises(UserError, match=r"QdstrmImporter -i .*report_0001\.qdstrm"):
        check_nsys_report(tmp_path / "report")


def test_no_report_at_all(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="nsys wrote no report"):
        check_nsys_report(tmp_path / "report")


# ---- GPU -------------------------------------------------------------------------------------------------


def test_has_cuda_gpu_matches_torch() -> None:
    import torch

    assert tools.has_cuda_gpu() is torch.cuda.is_available()


def test_require_gpu_without_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tools, "has_cuda_gpu", lambda: False)
    with pytest.raises(UserError, match="Stage 2 profiles GPU work: no CUDA GPU visible"):
        tools.require_gpu()
    monkeypatch.setattr(tools, "has_cuda_gpu", lambda: True)
    tools.require_gpu()
