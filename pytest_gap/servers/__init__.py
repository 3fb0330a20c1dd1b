"""Policy servers at the session level: which servers a session's configs need (registry.py),
starting and stopping them (manager.py), keeping them up (supervisor.py) and the checks run
before the first trial (preflight.py: the LLM key, the servers, the programs a config names).

The wire level (what a trial sends a server and reads back) is pytest_gap/policies/.
"""
