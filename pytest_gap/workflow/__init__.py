"""Workflows: typed graphs of robot skills. Knows nothing of benchmarks."""
