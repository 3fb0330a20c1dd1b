"""Workflow producers: the one way a trial's workflow gets written.

Its one job: for a (cell, task, instruction), write the workflow directory the trial runs, once,
whatever the number of workers (base.py `produce`), with the producer its mode names (prebuilt
templates and directories, or the LLM).
"""
