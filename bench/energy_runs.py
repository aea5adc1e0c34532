"""Benchmark helper (issue 24): J per decode token and what it rests on, one line per Stage 1 run folder, and the
spread of J per decode token over the folders given (repeatability between runs).

    python3 bench/energy_runs.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def line(folder: Path) -> tuple[str, float | None]:
    metrics = json.loads((folder / "metrics.json").read_text())
    energy = metrics.get("energy") or {}
    if not energy.get("available"):
        return f"{folder.name}: energy not available ({energy.get('reason')})", None
    steps = {s["stage"]: s["summary"] for s in metrics["stages"]}.get("decode/step", {})
    stages = {s["stage"]: s for s in energy["stages"]}
    decode = stages.get("decode") or {}
    measured = energy["measured"]
    loop = measured.get("decode") or measured.get("whole") or {}
    per_token = energy.get("joules_per_decode_token")
    text = (
        f"{folder.name}: {per_token:.4f} J/decode token ({energy.get('joules_per_decode_token_above_idle') or 0:.4f} "
        f"above idle), decode {decode.get('watts') or 0:.1f} W over {1e3 * (decode.get('seconds') or 0):.1f} ms per "
        f"pass, idle {energy['idle_watts']:.1f} W; {loop.get('what')} loop {loop.get('iterations')} x in "
        f"{loop.get('seconds', 0):.2f} s; timed step p50 {steps.get('p50', 0):.2f} ms, "
        f"CV {100 * steps.get('cv', 0):.1f}%; J/page {energy.get('joules_per_page') or 0:.2f}"
    )
    return text, per_token


def main(folders: list[Path]) -> None:
    values = []
    for folder in folders:
        text, value = line(folder)
        print(text)
        if value is not None:
            values.append(value)
    if len(values) >= 2:
        low, high = min(values), max(values)
        print(f"J/decode token over {len(values)} runs: {low:.4f}-{high:.4f} ({high / low - 1:.1%} apart)")


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]])
