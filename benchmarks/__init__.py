"""Benchmarks: scripts that measure the library and print their figures, apart from the launchers.

Each is `python -m benchmarks.<name>` (its docstring gives the command and
what it measures); those with configs read `benchmarks/configs/<name>.py`.
Results worth keeping go under docs/results/perf/ with the command that
made them (docs/results/INDEX.md).
"""
