"""What every Hydra entry point shares: config resolvers, the run-folder guard, and turning errors into exit codes."""

from __future__ import annotations

import contextlib
import logging
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from llm_perf_opt import artifacts, interrupts
from llm_perf_opt.cli import bug_report
from llm_perf_opt.config_compose import register_resolvers
from llm_perf_opt.errors import UserError
from llm_perf_opt.records.folders import REPORT_FILE
from llm_perf_opt.settings_schema import check_config

log = logging.getLogger("llm_perf_opt")


def print_error(exc: UserError) -> None:
    """The one paragraph a UserError ends a command with."""
    print(f"\nerror: {exc}", file=sys.stderr)


def exit_with(exc: UserError) -> NoReturn:
    """Print `exc` as one paragraph and exit with its code (2)."""
    print_error(exc)
    sys.exit(exc.exit_code)


def run_guarded(
    job: Callable[[], Any], *, run_dir: Path | None = None, in_sweep: bool = False, cfg: DictConfig | None = None
) -> Any:
    """Run `job`; a UserError becomes one paragraph on stderr and exit 2, Ctrl-C, SIGTERM or SIGHUP exit 130, and any
    other exception — a bug — one paragraph and exit 1, its traceback written to `run_dir`/error.log (`bug_report`).

    A file that cannot be written (full disk, unwritable folder) is a UserError too. Whatever ends the job, a
    `run_dir` whose status this process left reading `running` is marked failed with the reason (for a bug: what
    failed and where its traceback is); another process's folder is never touched.
    In a sweep (`in_sweep`), a UserError or a bug ends only this job: its folder is marked failed, the sweep goes on
    and its summary lists the job as skipped with the message. `cfg`: the composed config, whose settings are
    checked first (`settings_schema.check_config`: a sweep's job refuses its own bad value).
    """
    try:
        if cfg is not None:
            _checked(cfg, run_dir)
        result = job()
    except KeyboardInterrupt as stop:
        _mark_failed(run_dir, f"{interrupts.cause(stop)} before the run could record it")
        with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
            print(
                "\ninterrupted: what was measured so far was written; the run folder is marked interrupted.",
                file=sys.stderr,
            )
        sys.exit(130)
    except Exception as raised:  # noqa: BLE001 - the top of a command: whatever it is ends as one paragraph
        user_error = raised if isinstance(raised, UserError) else None
        if isinstance(raised, OSError):
            user_error = artifacts.environment_error(raised)  # None: an OSError that looks like a bug
        if user_error is None:
            code = _end_bug(raised, run_dir)
        else:
            _mark_failed(run_dir, str(user_error))
            print_error(user_error)
            code = user_error.exit_code
        if in_sweep:
            return None
        sys.exit(code)
    return result


def _checked(cfg: DictConfig, run_dir: Path | None) -> None:
    """`check_config` on a job's config; a refused setting in a folder no run has claimed yet (a sweep's job, whose
    folder the pipeline claims) claims it first, so that the folder is marked failed with the reason."""
    try:
        check_config(cfg)
    except UserError:
        if run_dir is not None and not (Path(run_dir) / artifacts.STATUS_FILE).exists():
            with contextlib.suppress(UserError, OSError):
                artifacts.claim(run_dir, stage=str(cfg.get("stage", "run")))
        raise


def _end_bug(exc: Exception, run_dir: Path | None) -> int:
    """A bug: its traceback written, `run_dir` marked failed with what failed and where that file is (also when the
    pipeline marked it failed with the bare exception), the paragraph printed; the exit code (1)."""
    log = bug_report.write_traceback(exc, run_dir)
    _mark_failed(run_dir, bug_report.status_message(exc, log), replacing=(artifacts.RUNNING, artifacts.FAILED))
    bug_report.print_bug(exc, log)
    return bug_report.BUG_EXIT_CODE


def _mark_failed(
    run_dir: Path | None, message: str, replacing: tuple[artifacts.RunState, ...] = (artifacts.RUNNING,)
) -> None:
    """Mark `run_dir` failed if this process's run still reads `running` there, or another of the states `replacing`
    (never another run's folder)."""
    if run_dir is not None and artifacts.mark_failed(run_dir, message, only_this_process=True, replacing=replacing):
        log.warning("run folder %s marked failed: %s", run_dir, message)


def check_run_folder(folder: Path, *, holds_jobs: bool = False) -> None:
    """Before Hydra writes anything into `folder`: UserError when it cannot be written or already holds a run.

    `holds_jobs`: `folder` is a sweep folder, refused when any job folder in it holds a run.
    """
    folder = Path(folder)
    jobs = sorted(p for p in folder.iterdir() if p.is_dir()) if holds_jobs and folder.is_dir() else []
    for held in [folder, *jobs]:
        artifacts.refuse_reuse(held)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise UserError(
            f"the output folder {folder.resolve()} cannot be written: {exc.strerror or exc}",
            f"Point {'hydra.sweep.dir' if holds_jobs else 'hydra.run.dir'} at a writable folder, or leave it unset "
            "for a fresh folder under tmp/",
        ) from exc


def claim_run_folder(folder: Path, stage: str) -> None:
    """Before Hydra writes anything into `folder`: check it (`check_run_folder`), then claim it for this run
    (`artifacts.claim`), so a run started at the same moment into the same folder is refused and writes nothing."""
    check_run_folder(folder)
    artifacts.claim(folder, stage=stage)


class RunFolderGuard(Callback):
    """Hydra callback (conf/stage1.yaml, analytic.yaml): refuse an unwritable folder, or one that holds a run, and
    claim the run folder, before Hydra writes its log and `.hydra/` into it — so a refused folder is left exactly as
    it was, even by a run started together with the one that holds it. Hydra 1.3 calls on_run_start before run_job
    writes anything (on_job_start comes after `.hydra/`); a multirun's job folders are claimed as each run starts."""

    def on_run_start(self, config: DictConfig, **kwargs: object) -> None:
        folder = Path(str(config.hydra.run.dir))
        stage = str(kwargs.get("config_name") or "run")  # the pipeline's own stage replaces it when the run starts
        self._or_exit(lambda: claim_run_folder(folder, stage))

    def on_multirun_start(self, config: DictConfig, **kwargs: object) -> None:
        self._or_exit(lambda: check_run_folder(Path(str(config.hydra.sweep.dir)), holds_jobs=True))

    @staticmethod
    def _or_exit(step: Callable[[], None]) -> None:
        """Run `step`; a UserError, or a folder that cannot be made or claimed, ends the command (exit 2): Hydra
        would turn an exception here into a warning and go on without the claim."""
        try:
            step()
        except UserError as exc:
            exit_with(exc)
        except OSError as exc:
            exit_with(
                artifacts.environment_error(exc)
                or UserError(
                    f"the output folder cannot be claimed: {exc.strerror or exc}"
                    + (f" ({exc.filename})" if exc.filename else ""),
                    "Point hydra.run.dir (hydra.sweep.dir for -m) at a writable folder with shorter names",
                )
            )


def launch(
    hydra_main: Callable[[], Any],
    config_name: str,
    command: str,
    check: Callable[[DictConfig], None] = check_config,
) -> None:
    """A console script: SIGTERM and SIGHUP handled like Ctrl-C (`interrupts`), resolvers (`--help`'s among them),
    a check of the overrides (their syntax, their keys: the nearest valid key for an unknown one) and of every
    setting's type on the composed config (`check`: `settings_schema.check_config`, and a command's own settings),
    one paragraph and exit 2 for a bad one before anything starts; then the Hydra entry point."""
    from llm_perf_opt.cli.help_text import register_resolver
    from llm_perf_opt.override_keys import check_override_keys

    interrupts.install()
    register_resolvers()
    register_resolver()
    try:
        check_override_keys(config_name, sys.argv[1:], command=command, check=check)
    except UserError as exc:
        exit_with(exc)
    hydra_main()


def print_report_path(run_dir: Path) -> None:
    """The last line a command prints: its report's bare path (`| tail -1` gives it to a script)."""
    print(run_dir / REPORT_FILE)


def rebuild_reports(
    prog: str,
    writer: str,
    render_module: str,
    argv: list[str] | None,
    *,
    cites_whatif: bool = False,
    names_modules: bool = False,
) -> None:
    """`<prog> <folder>`: rebuild a run folder's reports with `render(folder)` of `render_module` (imported late,
    so `--help` stays fast); the folder must have been written by `writer`; `--help` says what `help_text` holds
    for `prog`. `cites_whatif`: also take
    `--whatif <folder>`, a perf-whatif folder whose measured levers the recommendations cite; `names_modules`:
    also take `--stage1 <folder>`, a Stage 1 folder whose profiled pass names the kernels by module."""
    import importlib

    from llm_perf_opt.cli.help_text import command_parser

    parser = command_parser(prog)
    parser.add_argument("folder", type=Path, help=f"a folder written by {writer} (or a copy of one)")
    options: dict[str, str] = {}  # --<name> FOLDER -> its help
    if cites_whatif:
        options["whatif"] = (
            "a perf-whatif folder (holding whatif.json) whose measured gains 'What to try' cites; default: the "
            "what-if folder the run folder lies in, if any"
        )
    if names_modules:
        options["stage1"] = (
            "a Stage 1 folder of the same workload whose profiled pass (module attribution) names the kernels "
            "by the operator and module that launched them; default: the workload's own, when it ran the profiler"
        )
    for name, about in options.items():
        parser.add_argument(f"--{name}", type=Path, default=None, metavar="FOLDER", help=about)
    args = parser.parse_args(argv)
    extra = {name: getattr(args, name) for name in options}
    print_report_path(run_guarded(lambda: importlib.import_module(render_module).render(args.folder, **extra)))
