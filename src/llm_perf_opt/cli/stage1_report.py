"""`stage1-report <folder> [--whatif <perf-whatif folder>]`: rebuild a Stage 1 folder's Markdown reports and plots
from its records (no model, no GPU); with a what-if folder, "What to try" cites its measured levers."""

from __future__ import annotations

from llm_perf_opt.cli.common import rebuild_reports


def main(argv: list[str] | None = None) -> None:
    """Console script entry point."""
    rebuild_reports("stage1-report", "stage1-run", "llm_perf_opt.pipeline.stage1_render", argv, cites_whatif=True)


if __name__ == "__main__":
    main()
