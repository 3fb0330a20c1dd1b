"""Learned policies: the openpi and vla-eval websocket protocols, the observation formats, a
server and a client, built-in policies; and, for a session, the registry and manager that
start and find the servers a config names.

Its one job is to get actions from a policy server. The wire-level modules (wire, client,
server, formats, endpoint, builtin) know nothing of benchmarks; registry and manager read the
config.
"""
