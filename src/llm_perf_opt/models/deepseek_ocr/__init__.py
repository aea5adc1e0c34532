"""DeepSeek-OCR (v1) on transformers 5.x building blocks, without remote code.

``configuration`` (the sub-configs), ``modeling`` (the model), ``preprocess`` (the vendor's modes, crop grid and
token layout) and ``checkpoint`` (loading the official checkpoint layout by name map).
"""
