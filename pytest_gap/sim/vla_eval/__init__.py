"""vla-eval (allenai's vla-evaluation-harness, PyPI `vla-eval`) as a simulator backend.

Trials of a `backend: vla-eval` cell run through vla-eval's own benchmark adapters and episode
loop, in-process, against the policy registry's model servers (`backend.py`, over
`catalogue.py`, what vla-eval offers, and `env.py`, the episode loop). Everything this
package assumes about vla-eval internals is a named claim in `claims.py`, checked by
`gap verify-harness`.
"""
