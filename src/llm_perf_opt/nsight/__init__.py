"""Nsight Systems and Nsight Compute: build the commands, run them, parse their exports."""
