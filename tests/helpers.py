"""Helpers shared by the tests (importable as `helpers`: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import contextlib
import gzip
import importlib
import io
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any


def load_script(path: Path) -> ModuleType:
    """A script of the repository (scripts/*.py, not a package module), imported under its file's name."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_cli(module: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """`python -m <module> <args>` as a user would run the console script, output captured."""
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def run_main(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The console script `module`'s `main()` run in this process with `args` as its command line: exit code, stdout
    and stderr as `run_cli` gives them, without the seconds a child process spends importing torch and transformers.

    For tests of what a command decides before it measures anything (bad input refused in one paragraph, the folder
    marked); the real entry point's contract (a child process, its exit code) keeps its own `run_cli` tests. What a
    command changes in this process (argv, signal handlers, logging handlers, cwd, environment, torch's thread count)
    is put back; an exception a child would die of is raised here (the test fails with its traceback)."""
    import torch

    main = importlib.import_module(module).main
    saved_argv, saved_cwd, saved_env = sys.argv, os.getcwd(), dict(os.environ)
    saved_signals = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    saved_logging = logging_state()
    saved_threads = torch.get_num_threads()
    stdout, stderr = io.StringIO(), io.StringIO()
    code: int | str | None = 0
    sys.argv = [module, *args]
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                main()
            except SystemExit as ended:
                code = ended.code
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        for signum, handler in saved_signals.items():
            signal.signal(signum, handler)
        restore_logging(saved_logging)
        torch.set_num_threads(saved_threads)
    if isinstance(code, str):  # sys.exit("message"): the message on stderr, exit 1
        stderr.write(f"{code}\n")
        code = 1
    return subprocess.CompletedProcess([module, *args], code or 0, stdout.getvalue(), stderr.getvalue())


LoggingState = dict[logging.Logger, tuple[list[logging.Handler], int, bool, bool]]


def _loggers() -> list[logging.Logger]:
    return [logging.getLogger(), *(logging.getLogger(name) for name in list(logging.root.manager.loggerDict))]


def logging_state() -> LoggingState:
    """Every logger's handlers, level, propagation and disabled flag (`restore_logging` puts them back)."""
    return {log: (list(log.handlers), log.level, log.propagate, log.disabled) for log in _loggers()}


def restore_logging(saved: LoggingState) -> None:
    """Loggers as they were before a command configured logging (Hydra's job logging); its own handlers closed."""
    for log in _loggers():
        handlers, level, propagate, disabled = saved.get(log, ([], logging.NOTSET, True, False))
        for handler in log.handlers:
            if handler not in handlers:
                handler.close()
        log.handlers[:] = handlers
        log.setLevel(level)
        log.propagate, log.disabled = propagate, disabled


FIXTURES = Path(__file__).parent / "fixtures"
# The quickest real stage1-run (tiny model, CPU, 2 new tokens, no profiler), for tests of a whole process.
TINY_STAGE1 = (
    "model=deepseek_ocr_tiny",
    "device=cpu",
    "infer.max_new_tokens=2",
    "pipeline.torch_profiler.enable=false",
)


def measured_energy(joules_per_decode_token: float) -> Any:
    """An energy record of a pass that ran (its idle window only), giving `joules_per_decode_token`."""
    from llm_perf_opt.records.memory import EnergyPass, EnergyReport, EnergyWindow

    idle = EnergyWindow(what="idle", iterations=1, seconds=1.0, millijoules=50_000)
    measured = EnergyPass(input="page", pages=1, new_tokens=2, idle=idle)
    return EnergyReport(available=True, measured=measured, joules_per_decode_token=joules_per_decode_token)


def wait_for_log(folder: Path, needle: str, process: subprocess.Popen[str], timeout_s: float = 300) -> None:
    """Wait until a log file in `folder` says `needle` (a run's progress), failing if `process` ends first."""
    import pytest

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(needle in log.read_text(errors="replace") for log in folder.glob("*.log")):
            return
        if process.poll() is not None:
            pytest.fail(f"the run ended (exit {process.returncode}) before its log said {needle!r}")
        time.sleep(0.2)
    pytest.fail(f"no log in {folder} said {needle!r} within {timeout_s:g} s")


def run_whatif(config_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    """`perf-whatif --config-dir <config_dir> <overrides>` in this process (`run_main`); its fork server, rungs and
    Hydra multiruns are processes of their own as in a real run. The console script's own process, exit on a stop
    signal included, is tested with `subprocess.Popen` (test_whatif_cli, test_whatif_hydra)."""
    return run_main("llm_perf_opt.cli.whatif", "--config-dir", str(config_dir), *overrides)


def preset_dir(root: Path, name: str, preset: str) -> Path:
    """A user config dir under `root` holding the what-if preset `whatif/<name>.yaml`."""
    (root / "whatif").mkdir(parents=True)
    (root / "whatif" / f"{name}.yaml").write_text(preset)
    return root


def require_tools(*names: str) -> None:
    """Skip the calling test unless every named program (e.g. nsys, ncu) is on PATH."""
    import pytest

    missing = [name for name in names if shutil.which(name) is None]
    if missing:
        pytest.skip(f"needs {' and '.join(missing)} on PATH")


def unpack_nsys_fixture(folder: Path, name: str = "h100_tiny.sqlite.gz") -> Path:
    """The gzipped nsys sqlite export `name` from tests/fixtures/nsys as `folder`/nsys/report.sqlite."""
    target = folder / "nsys" / "report.sqlite"
    target.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(FIXTURES / "nsys" / name) as src, target.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return target


def greedy_by_recomputation(session: Any, prepared: Any, new_tokens: int) -> list[int]:
    """Greedy tokens with no KV cache: the whole sequence is run again for every token (the reference for the
    session's cached prefill/decode loop)."""
    import torch

    ids, inputs, tokens = prepared.input_ids, dict(prepared.model_inputs), []
    with torch.inference_mode():
        for _ in range(new_tokens):
            inputs.update(input_ids=ids, attention_mask=torch.ones_like(ids))
            token = session.model(**inputs, use_cache=False).logits[:, -1].argmax(-1)
            tokens.append(int(token))
            ids = torch.cat([ids, token[:, None]], dim=1)
    return tokens


def host_reads() -> Any:
    """A dispatch mode that lists the ops inside it which read tensor data on the host (`.item()`, `bool(t)`,
    data-dependent shapes): on a GPU each is a device-to-host copy and a stream synchronisation."""
    from torch.utils._python_dispatch import TorchDispatchMode

    reading = ("_local_scalar_dense", "is_nonzero", "nonzero", "unique", "masked_select", "equal")

    class HostReads(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            name = str(func)
            if any(part in name for part in reading):
                self.ops.append(name)
            return func(*args, **(kwargs or {}))

    return HostReads()


def rope_table_flops(model: Any, tokens: int) -> int:
    """FLOPs that FlopCounterMode sees in the first rotary-embedding table of `model` (pass the decoder where a vision
    encoder has one too) for `tokens` positions.

    Older transformers releases (5.17 among them) build the table with a (head_dim/2 × 1) @ (1 × tokens) matmul
    (head_dim × tokens FLOPs, counted); newer ones (5.24) multiply elementwise (0). The analytic models leave this
    release detail out, so tests that compare them with the counter exactly add it back."""
    import torch

    from llm_perf_opt.instruments.flops import flop_counter

    rotary = next(m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding"))
    with torch.inference_mode(), flop_counter() as counter:
        rotary(torch.zeros(1, tokens, 1), torch.arange(tokens)[None])
    flops = int(counter.get_total_flops())
    assert flops % tokens == 0 and flops <= 512 * tokens, flops  # 0, or head_dim per position
    return flops


def exit_code(main: Callable[[list[str]], object], *argv: str) -> int:
    """The exit code of a console script's `main(argv)` run in this process (0 when it returns)."""
    try:
        main(list(argv))
    except SystemExit as ended:
        return int(ended.code or 0)
    return 0


#: Three bundled sample pages of unlike shapes (portrait, square, long): a batch whose pages differ.
SAMPLE_PAGES = ("page_portrait.png", "slide_square.png", "receipt_long.png")


def sample_pages(*names: str) -> list[Path]:
    """The bundled sample pages `names` (default: every one of `SAMPLE_PAGES`), as paths."""
    from llm_perf_opt.data.dataset import bundled_samples_dir

    return [bundled_samples_dir() / name for name in names or SAMPLE_PAGES]


def stage2_settings(cfg: Any) -> Any:
    """`Stage2Settings` of a composed stage2 config, read as stage2-profile reads them."""
    from llm_perf_opt.config_data import command_config
    from llm_perf_opt.pipeline.stage2_settings import Stage2Settings

    return Stage2Settings.from_config(command_config(cfg))


def stage2_run(cfg: Any, run_dir: Path, run_id: str = "x", task_overrides: list[str] | None = None) -> Any:
    """A `Stage2Run` of a composed stage2 config, its settings read as stage2-profile reads them."""
    from llm_perf_opt.pipeline import stage2

    return stage2.Stage2Run(stage2_settings(cfg), run_dir, run_id, task_overrides or [])


def whatif_run(cfg: Any, run_dir: Path, run_id: str = "w", workload: tuple[str, ...] = ()) -> Any:
    """A `WhatIfRun` of a composed whatif config (no whatif=advised), its settings read as perf-whatif reads them."""
    from llm_perf_opt.config_data import command_config, whatif_nodes
    from llm_perf_opt.pipeline.whatif import WhatIfRun

    return WhatIfRun(command_config(cfg), run_dir, run_id, workload, whatif=whatif_nodes(cfg))
