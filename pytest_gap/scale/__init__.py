"""Scaling out: trials on a Ray cluster (ray_executor), shards and their merge."""
