"""Simulators: the `Backend`/`Env` protocols (backend.py) and the in-process LIBERO backend.

Its one job is to run episodes (reset to a seed, step, judge success) and describe what can be
run (suites, tasks, families, variations). Knows nothing of pytest, policies, skills or
benchmarks.
"""
