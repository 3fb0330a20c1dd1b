"""Workflows: typed graphs of robot skills, validated (schema.py) and executed (executor.py).

Its one job is to run one workflow on one env and trace it. Knows nothing of benchmarks or
pytest.
"""
