"""Simulation layer: LIBERO in-process. Knows nothing of pytest or benchmarks."""
