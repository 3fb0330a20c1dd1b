"""Workflow producers: how each mode gets the workflow a trial runs."""
