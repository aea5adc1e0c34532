"""The preloaded fork server what-if rungs start from (pipeline/rung_forks.py): exit statuses, environment, logs,
a session of their own, stopping, and the fallback when it cannot start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import whatif_run
from llm_perf_opt.config_compose import compose_config
from llm_perf_opt.config_data import stage1_nodes, whatif_nodes
from llm_perf_opt.pipeline import rung_forks
from llm_perf_opt.pipeline.rung_forks import COMPILE_PRELOAD, ForkServer, StartingServer
from llm_perf_opt.pipeline.whatif import rungs_compile

TESTS = Path(__file__).parent


def _failing_torchao(root: Path) -> Path:
    """`root` holding a stand-in torchao 0.18.0 (installed as far as importlib.metadata can tell) that fails when
    imported: with torchao installed, importing transformers imports torchao, whose import creates a CUDA context on
    a GPU machine (so no rung could be forked)."""
    package = root / "torchao"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('torchao was imported by the preload')\n")
    info = root / "torchao-0.18.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torchao\nVersion: 0.18.0\n")
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkServer]:
    """One fork server for the module, started with the failing stand-in torchao on its path (one server start, not
    a second for test_the_server_preloads_transformers_without_importing_torchao; its rungs never import torchao)."""
    torchao = _failing_torchao(tmp_path_factory.mktemp("torchao"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), str(torchao), os.environ.get("PYTHONPATH", "")]))
        started = ForkServer.start()
    assert started is not None, "the fork server did not start (with a failing stand-in torchao on its path)"
    yield started
    started.close()


def test_a_forked_process_reports_its_exit_status(server: ForkServer, tmp_path: Path) -> None:
    assert server.spawn(["exit", "3"], tmp_path / "a.log", {}, module="fork_target").wait(timeout=30) == 3
    assert server.spawn(["exit", "0"], tmp_path / "b.log", {}, module="fork_target").wait(timeout=30) == 0
    failed = server.spawn(["raise", "boom"], tmp_path / "c.log", {}, module="fork_target")
    assert failed.wait(timeout=30) == 1
    assert "RuntimeError: boom" in (tmp_path / "c.log").read_text()  # the traceback is in its log


def test_a_forked_process_gets_its_environment_log_and_session(server: ForkServer, tmp_path: Path) -> None:
    log = tmp_path / "env.log"
    rung = server.spawn(["env", "LLO_FORK_TEST"], log, {"LLO_FORK_TEST": "yes"}, module="fork_target")
    assert rung.wait(timeout=30) == 0
    assert f"LLO_FORK_TEST=yes pgid={rung.pid} pid={rung.pid}" in log.read_text()  # it leads its own group
    assert os.environ.get("LLO_FORK_TEST") is None  # set in the child only


def test_a_forked_process_is_waited_for_and_stopped_like_a_popen(server: ForkServer, tmp_path: Path) -> None:
    rung = server.spawn(["sleep", "60"], tmp_path / "sleep.log", {}, module="fork_target")
    with pytest.raises(subprocess.TimeoutExpired):
        rung.wait(timeout=0.5)
    assert rung.poll() is None
    os.killpg(rung.pid, signal.SIGTERM)  # how the rung runner stops a group
    assert rung.wait(timeout=30) == -signal.SIGTERM
    rung.send_signal(signal.SIGTERM)  # an ended rung: nothing to signal, no error


def test_rungs_spawned_at_once_from_several_threads_each_get_their_own_process(
    server: ForkServer, tmp_path: Path
) -> None:
    """Rungs on several devices are spawned from one thread each: every handle must be its own rung's process (the
    H100 run of 2026-11-27 handed one rung another's pid, and judged it by the other's end)."""
    from concurrent.futures import ThreadPoolExecutor

    def spawn(i: int) -> tuple[int, int]:
        rung = server.spawn(["env", f"RUNG_{i}"], tmp_path / f"{i}.log", {f"RUNG_{i}": str(i)}, module="fork_target")
        return i, rung.pid

    with ThreadPoolExecutor(max_workers=8) as pool:
        spawned = list(pool.map(spawn, range(16)))
    for i, pid in spawned:
        log = tmp_path / f"{i}.log"
        for _ in range(300):  # the handle's wait is not what is tested: the log names the process that wrote it
            if log.is_file() and "pid=" in log.read_text():
                break
            time.sleep(0.1)
        assert f"RUNG_{i}={i} pgid={pid} pid={pid}" in log.read_text()


def test_the_server_outlives_a_terminal_ctrl_c(server: ForkServer, tmp_path: Path) -> None:
    """Ctrl-C reaches the whole foreground group; the what-if run stops the rungs, the server must stay to report."""
    rung = server.spawn(["sleep", "0.5"], tmp_path / "sleep.log", {}, module="fork_target")
    os.kill(server._process.pid, signal.SIGINT)
    os.kill(server._process.pid, signal.SIGTERM)
    assert rung.wait(timeout=30) == 0  # the rung is in a session of its own: untouched
    assert server.spawn(["exit", "4"], tmp_path / "after.log", {}, module="fork_target").wait(timeout=30) == 4


def test_a_server_for_compiled_rungs_preloads_torch_compiles_modules(server: ForkServer, tmp_path: Path) -> None:
    """torch.compile's first call imports inductor (~3-4 s of a compiled rung on the H100 machines): a server whose
    rungs compile imports it right after forking the first rung (which waits for the file it then creates before
    its warm-up passes), so the rungs forked after it have it already; the server still holds no CUDA context. One
    whose rungs do not compile never imports it."""
    module = COMPILE_PRELOAD[0]
    plain = server.spawn(["module", module], tmp_path / "plain.log", {}, module="fork_target")
    assert plain.wait(timeout=30) == 0
    assert f"{module} not loaded" in (tmp_path / "plain.log").read_text()
    assert server.compile_preloaded is None
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
        compiling = ForkServer.start(compiles=True)
    assert compiling is not None, "the fork server with torch.compile's modules did not start"
    done = compiling.compile_preloaded
    assert done is not None and not done.exists()  # not before the first rung
    try:
        first = compiling.spawn(["module", module], tmp_path / "first.log", {}, module="fork_target")
        assert first.wait(timeout=30) == 0
        assert f"{module} not loaded" in (tmp_path / "first.log").read_text()  # forked before the import
        deadline = time.monotonic() + 120
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert done.exists(), "the server did not say it had imported torch.compile's modules"
        later = compiling.spawn(["module", module], tmp_path / "later.log", {}, module="fork_target")
        assert later.wait(timeout=30) == 0
        assert f"{module} loaded" in (tmp_path / "later.log").read_text()
    finally:
        compiling.close()
    assert not done.parent.exists()  # its folder is removed with the server


@pytest.mark.parametrize(
    ("overrides", "compiles"),
    [
        (("whatif=decode",), True),  # cuda_graphs, compiled_decode
        (("whatif=batch",), False),
        (("whatif=batch", "runtime.kv_cache=static", "runtime.compile=decode"), True),  # the workload compiles
        (("whatif=batch", "runtime.compile_vision=default"), True),
        (("whatif=batch", "+whatif.levers.graphs={overrides: ['runtime.compile=decode']}"), True),
        (("whatif=batch", "+whatif.levers.off={overrides: ['runtime.compile=none']}"), False),
    ],
)
def test_the_what_if_knows_whether_a_rung_may_compile(overrides: tuple[str, ...], compiles: bool) -> None:
    cfg = compose_config("whatif", *overrides)
    assert rungs_compile(whatif_nodes(cfg).whatif, stage1_nodes(cfg).runtime) is compiles


def test_rungs_start_fresh_when_the_server_does_not_answer(caplog: pytest.LogCaptureFixture) -> None:
    assert ForkServer.start(timeout_s=0.01) is None  # it cannot have imported torch in 10 ms
    assert "rungs start as fresh processes" in caplog.text


def test_a_launched_server_imports_in_the_background_and_can_be_cancelled() -> None:
    """The what-if run launches the server first and waits for it only when its first rung is due; a run that ends
    before (a refused baseline, bad input) cancels it, leaving no process behind."""
    starting = StartingServer.launch()
    assert starting._process.poll() is None  # launching does not wait for the imports
    starting.cancel()
    assert starting._process.returncode is not None
    later = StartingServer.launch().ready()
    assert later is not None, "the fork server did not start"
    later.close()
    assert later._process.returncode == 0


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ((), True),  # the default
        (("whatif_run.fork_rungs=false",), False),
        (("whatif_run.launcher=hydra",), False),  # Hydra's launcher starts the rungs itself
    ],
)
def test_the_what_if_forks_its_rungs_when_asked(overrides: tuple[str, ...], expected: bool, tmp_path: Path) -> None:
    assert whatif_run(compose_config("whatif", *overrides), tmp_path).fork_rungs is expected


def test_a_bad_fork_rungs_setting_is_refused() -> None:
    from llm_perf_opt.errors import UserError
    from llm_perf_opt.override_keys import check_override_keys

    with pytest.raises(UserError, match=r"whatif_run.fork_rungs=often is not true or false"):  # before composing
        check_override_keys("whatif", ["whatif_run.fork_rungs=often"], command="perf-whatif")


# A stand-in for a what-if run: a fork server with one forked rung, and one rung started as a fresh process.
STAND_IN = """\
import sys, time
from pathlib import Path
from llm_perf_opt.pipeline.rung_forks import ForkServer
from llm_perf_opt.pipeline.whatif_rungs import _started

folder = Path(sys.argv[1])
server = ForkServer.start()
assert server is not None
forked = server.spawn(["sleep", "300"], folder / "forked.log", {}, module="fork_target")
fresh = _started([sys.executable, "-c", "import time; time.sleep(300)"], folder / "fresh.log")
print(server._process.pid, forked.pid, fresh.pid, flush=True)
time.sleep(300)
"""


@pytest.mark.slow
def test_a_killed_what_if_run_takes_its_server_and_rungs_with_it(tmp_path: Path) -> None:
    """SIGKILL (no handler sees it) of the what-if run: its fork server and every rung die with it (before: they went
    on for minutes as orphans, holding the GPU)."""
    from llm_perf_opt.records.folders import pid_alive

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.Popen([sys.executable, "-c", STAND_IN, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert run.stdout is not None
        pids = [int(pid) for pid in run.stdout.readline().split()]
        assert len(pids) == 3 and all(pid_alive(pid) for pid in pids)
    finally:
        run.kill()
        run.wait()
    deadline = time.monotonic() + 30
    while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in pids if pid_alive(pid)]
    for pid in left:  # not left behind by a failing test
        os.kill(pid, signal.SIGKILL)
    assert not left, f"still running after the what-if run was killed: {left} of server, forked, fresh {pids}"


def test_a_cuda_initialisation_during_the_imports_is_named_by_its_caller() -> None:
    """The server names where a CUDA context came from when it must refuse (a CPU stand-in for `torch._C`)."""

    class FakeC:
        calls = 0

        @classmethod
        def _cuda_init(cls) -> None:
            cls.calls += 1

    fake_torch = types.SimpleNamespace(_C=FakeC)
    real = FakeC._cuda_init

    def an_import_that_initialises_cuda() -> None:
        fake_torch._C._cuda_init()

    with rung_forks._cuda_init_watched(fake_torch) as where:
        an_import_that_initialises_cuda()
        an_import_that_initialises_cuda()
    assert FakeC.calls == 2 and len(where) == 1  # the first caller only
    assert where[0].startswith("test_rung_forks.py:") and "an_import_that_initialises_cuda" in where[0]
    assert fake_torch._C._cuda_init == real  # restored after the imports
    with rung_forks._cuda_init_watched(types.SimpleNamespace(_C=object())) as none:  # a CPU build: nothing to watch
        assert none == []


def test_the_server_preloads_transformers_without_importing_torchao(server: ForkServer, tmp_path: Path) -> None:
    """With torchao installed, importing transformers imports torchao, whose import creates a CUDA context on a GPU
    machine (so no rung could be forked); the server keeps transformers from importing it (the module's server
    started with a stand-in torchao that fails when imported), and transformers sees the real check again after the
    preload."""
    assert server is not None, "the fork server refused with torchao installed"
    probe_log = tmp_path / "torchao.log"
    assert server.spawn(["module", "torchao"], probe_log, {}, module="fork_target").wait(timeout=30) == 0
    assert "torchao not loaded" in probe_log.read_text()  # the preload did not import it

    import transformers.utils as utils

    real = utils.is_torchao_available
    probe = types.ModuleType("transformers.llo_probe")
    with pytest.MonkeyPatch.context() as mp, rung_forks._torchao_import_deferred():
        mp.setitem(sys.modules, probe.__name__, probe)
        probe.is_torchao_available = utils.is_torchao_available  # what a module imported in the block binds
        assert not probe.is_torchao_available()
        assert probe.is_torchao_available is not real
    assert probe.is_torchao_available is real and utils.is_torchao_available is real
