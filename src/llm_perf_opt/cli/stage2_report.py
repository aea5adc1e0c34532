"""`stage2-report <folder>`: rebuild a Stage 2 folder's Markdown and JSON from its exports (no GPU, no Nsight)."""

from __future__ import annotations

from llm_perf_opt.cli.common import rebuild_reports


def main(argv: list[str] | None = None) -> None:
    """Console script entry point."""
    rebuild_reports(
        "stage2-report", "stage2-profile", "llm_perf_opt.pipeline.stage2", argv, cites_whatif=True, names_modules=True
    )


if __name__ == "__main__":
    main()
