"""Model implementations the project ships (for architectures transformers does not provide natively)."""
