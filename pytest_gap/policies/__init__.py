"""Learned policies: the openpi websocket protocol, its server and client, built-in policies."""
