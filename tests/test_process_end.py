"""A console script's process ends without the module teardown, and with everything else an exit does: its code,
its atexit handlers, its flushed output, and a wait for a thread still working."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llm_perf_opt.cli import analytic, stage1, stage2, whatif

SCRIPT = """\
import atexit, sys, threading, time
from pathlib import Path
from llm_perf_opt.process_end import ends_process

out = Path(sys.argv[1])

def main():
    atexit.register(lambda: (out / "atexit").write_text("ran"))
    print("printed, not yet flushed", end="")
    if "thread" in sys.argv:
        threading.Thread(target=lambda: (time.sleep(0.5), (out / "thread").write_text("done"))).start()
    if "code" in sys.argv:
        raise SystemExit(3)
    if "text" in sys.argv:
        raise SystemExit("a message")
    if "bug" in sys.argv:
        raise RuntimeError("a bug")

ends_process(main)()
"""


def _run(tmp_path: Path, *how: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    return subprocess.run(
        [sys.executable, str(script), str(tmp_path), *how], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize(("how", "code"), [((), 0), (("code",), 3), (("text",), 1), (("bug",), 1)])
def test_the_exit_code_output_and_atexit_handlers_are_kept(tmp_path: Path, how: tuple[str, ...], code: int) -> None:
    done = _run(tmp_path, *how)
    assert done.returncode == code, done.stderr
    assert done.stdout == "printed, not yet flushed"
    assert (tmp_path / "atexit").read_text() == "ran"
    if how == ("text",):
        assert done.stderr.strip() == "a message"
    if how == ("bug",):
        assert "RuntimeError: a bug" in done.stderr  # an unexpected exception keeps its traceback


def test_a_thread_still_working_is_waited_for(tmp_path: Path) -> None:
    done = _run(tmp_path, "thread")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "thread").read_text() == "done"


def test_the_hydra_commands_console_scripts_end_their_process() -> None:
    text = Path(__file__).parents[1].joinpath("pyproject.toml").read_text()
    for module, script in (
        (stage1, "stage1-run"),
        (stage2, "stage2-profile"),
        (whatif, "perf-whatif"),
        (analytic, "analytic-report"),
    ):
        assert f'{script} = "{module.__name__}:console"' in text
        assert module.console.__wrapped__ is module.main  # type: ignore[attr-defined]  # main itself returns


@pytest.mark.parametrize("variable", ["CUDA_INJECTION64_PATH", "LD_PRELOAD"])
def test_a_process_a_tool_is_injected_into_ends_the_ordinary_way(variable: str) -> None:
    check = "from llm_perf_opt.process_end import needs_ordinary_exit; print(needs_ordinary_exit())"
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_INJECTION64_PATH", "LD_PRELOAD")}
    plain = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, check=True)
    assert plain.stdout.strip() == "False"  # no CUDA context, nothing injected, no other thread
    env[variable] = "/opt/nvidia/nsight-systems/target-linux-x64/libToolsInjection64.so"
    injected = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, check=True)
    assert injected.stdout.strip() == "True"  # a profiler writes its data at the C-level exit
