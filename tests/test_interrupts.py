"""SIGTERM ends a run exactly like Ctrl-C: what was measured is written and the folder is marked interrupted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import TINY_STAGE1, wait_for_log
from llm_perf_opt import interrupts
from llm_perf_opt.records.folders import load_stage1, read_status


@pytest.fixture
def restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's stop handlers (and the stop state) as an interactive shell starts a command with, put back
    after the test: pytest started with SIGINT ignored (a background job, `nohup`) runs these tests the same."""
    monkeypatch.setattr(interrupts, "_stopping", [])
    monkeypatch.setattr(interrupts, "_taken", [])
    previous = {signum: signal.getsignal(signum) for signum in interrupts.NAMES}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@pytest.fixture
def installed(restored: None) -> None:
    """`interrupts.install()` in this process, undone after the test."""
    interrupts.install()


def test_sigterm_is_a_keyboard_interrupt_once(installed: None) -> None:
    with pytest.raises(KeyboardInterrupt) as stopped:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs at the next bytecode; never reached
    assert interrupts.cause(stopped.value) == "stopped by SIGTERM"
    os.kill(os.getpid(), signal.SIGTERM)  # while stopping: ignored, so writing what was measured goes on
    time.sleep(0.05)
    with pytest.raises(KeyboardInterrupt) as again:  # a second Ctrl-C still interrupts
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    assert interrupts.cause(again.value) == "interrupted by the user (Ctrl-C)"


def test_a_sigterm_after_ctrl_c_is_ignored(installed: None) -> None:
    """perf-whatif forwards SIGTERM to a rung that the terminal's Ctrl-C already stopped."""
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)  # reached: the SIGTERM raised nothing


def test_sighup_stops_like_sigterm_and_is_named(installed: None) -> None:
    """A closed terminal or SSH session (SIGHUP) stops a run like SIGTERM (before: the process died at once)."""
    with pytest.raises(KeyboardInterrupt) as stopped:
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(5)
    assert interrupts.cause(stopped.value) == "stopped by SIGHUP (a closed terminal or session)"
    assert interrupts.stop_signal() == signal.SIGHUP
    os.kill(os.getpid(), signal.SIGTERM)  # while stopping: ignored
    os.kill(os.getpid(), signal.SIGHUP)
    time.sleep(0.05)  # reached


@pytest.mark.parametrize(
    ("signum", "own_group", "forwarded"),
    [
        (signal.SIGINT, True, signal.SIGINT),  # a forked rung in its own session: it says Ctrl-C, not SIGTERM
        (signal.SIGINT, False, signal.SIGTERM),  # a rung in this group got the terminal's Ctrl-C already
        (signal.SIGHUP, True, signal.SIGHUP),
        (signal.SIGTERM, False, signal.SIGTERM),
    ],
)
def test_a_rung_is_stopped_with_the_signal_that_stopped_the_what_if_run(
    installed: None, signum: int, own_group: bool, forwarded: int
) -> None:
    from llm_perf_opt.pipeline.whatif_rungs import forwarded_stop

    assert forwarded_stop(own_group) == signal.SIGTERM  # not stopped: a rung past its time limit gets SIGTERM
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signum)
        time.sleep(5)
    assert forwarded_stop(own_group) == forwarded


def test_a_stop_swallowed_on_its_way_is_stopped_again(installed: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyboardInterrupt that code on its way swallows (a library's import catching every exception) leaves the run
    going with no handler having taken the stop: a SIGTERM soon after is still ignored (a scheduler's group signal
    followed by perf-whatif's own), one after RESTOP_AFTER_S stops again; once a handler took the stop, never."""
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    except KeyboardInterrupt:
        pass  # swallowed: no handler asked interrupts.cause()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)  # reached: within RESTOP_AFTER_S the second SIGTERM is ignored
    monkeypatch.setattr(interrupts, "RESTOP_AFTER_S", 0.0)
    with pytest.raises(KeyboardInterrupt) as again:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert interrupts.cause(again.value) == "stopped by SIGTERM"  # taken: from now on SIGTERM is ignored
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)  # reached


def test_the_what_if_stopper_repeats_sigterm_for_a_rung_that_lost_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """perf-whatif stops a rung with SIGTERM and, if it still runs after RESEND_AFTER_S, SIGTERM again before the
    SIGKILL at the end of the grace period: a rung whose first stop was swallowed ends on the second."""
    from llm_perf_opt.pipeline import whatif_rungs

    monkeypatch.setattr(whatif_rungs, "RESEND_AFTER_S", 0.5)
    swallow_once = (
        "import signal, sys, time\n"
        "seen = []\n"
        "def on_term(signum, frame):\n"
        "    seen.append(signum)\n"
        "    if len(seen) > 1:\n"
        "        sys.exit(3)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    time.sleep(0.05)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", swallow_once], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    started = time.monotonic()
    whatif_rungs._stop(child)
    assert child.returncode == 3  # ended by the second SIGTERM, not killed
    assert time.monotonic() - started < whatif_rungs.STOP_GRACE_S


def test_a_signal_started_ignored_stays_ignored(restored: None) -> None:
    """A run started under `nohup` (SIGHUP ignored) or as a background job (SIGINT ignored) keeps ignoring it."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    interrupts.install()
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    assert signal.getsignal(signal.SIGINT) == interrupts._interrupt
    assert signal.getsignal(signal.SIGTERM) == interrupts._interrupt


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "cause"),
    # SIGTERM takes the same handler and writing path: its name is checked above (test_sigterm_is_a_keyboard_
    # interrupt_once) and a real stage1-run stopped by it in test_whatif_cli (the rung of
    # test_sigterm_mid_rung_keeps_the_rungs_passes), so one child process here, not two.
    [(signal.SIGHUP, "stopped by SIGHUP (a closed terminal or session)")],
)
def test_a_stop_signal_to_stage1_run_writes_what_was_measured(tmp_path: Path, signum: int, cause: str) -> None:
    """Before: the process died at once, its folder left `running` with no files. Now: exit 130, `interrupted`."""
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "llm_perf_opt.cli.stage1", *TINY_STAGE1, "run.repeats=50", f"hydra.run.dir={out}"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_log(out, "repeat 2/50", process)
        process.send_signal(signum)
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 130, err[-2000:]
    assert "interrupted: what was measured so far was written" in err
    status = read_status(out)
    assert status.state == "interrupted"
    assert status.message == f"{cause}; results so far were written"
    assert "metrics.json" in status.files and "report.md" in status.files
    settings = load_stage1(out).metrics.settings
    assert settings.partial and settings.asked_passes == 50
    assert settings.measured_passes is not None and 2 <= settings.measured_passes < 50
