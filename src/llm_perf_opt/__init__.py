"""llm-perf-opt: where the inference time of a vision-language model goes, and how far it is from the hardware."""

import time as _time

__version__ = "0.1.0"

# When the package was first imported: where the process's start time cannot be read (macOS, Windows), a
# command's time budget counts its `start` part from here (`time_ledger`).
IMPORTED_AT = _time.perf_counter()
