"""Typed run records: the only thing passed from measurement to reports and between commands.

- `vocabulary`: stage names, the NVTX domain, dtype names (imports nothing from the package);
- `common`: schema version, run states, `Summary`, `PeakFigure`, `RunStatus`;
- `stage1`, `stage2`, `analytic`, `sweep`, `comparison`: the records each command writes;
- `io`: save/load through one cattrs converter; `folders`: a whole run folder as typed records (`load`).
"""
