"""The trial level: what one trial runs, produces and records, on whichever process runs it.

produce.py: which workflow a trial runs and the one call that has it produced.
"""
