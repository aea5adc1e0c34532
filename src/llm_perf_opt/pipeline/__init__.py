"""Pipelines: what each command does, step by step."""
