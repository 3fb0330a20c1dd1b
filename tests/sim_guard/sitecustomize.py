"""Started first in every Python process of an armed fast-tier session (this folder leads
PYTHONPATH there): record its start if a test started it, guard it against building a real
simulator (gap_sim_guard.py), then run the sitecustomize this one shadows, if there is one."""

import importlib.machinery
import importlib.util
import os
import sys

import gap_sim_guard

gap_sim_guard.started()
gap_sim_guard.install()

_here = os.path.dirname(os.path.abspath(__file__))
_rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.loader is not None:
    _shadowed = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_shadowed)
