"""Scaling a benchmark out: shards of a plan and their merge, the Ray executor."""
