"""pytest-gap: a pytest-native evaluation harness for robot manipulation policies.

This package's job: turn a benchmark YAML into one pytest item per trial, run each trial's
workflow in a simulator, and fold the results into a gated summary. The layers and seams are
described in docs/architecture.md.
"""

__version__ = "0.1.0"
