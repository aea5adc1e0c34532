"""llm-perf-opt: where the inference time of a vision-language model goes, and how far it is from the hardware."""

__version__ = "0.1.0"
