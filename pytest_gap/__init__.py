"""pytest-gap: a pytest-native evaluation harness for robot manipulation policies."""

__version__ = "0.1.0"
