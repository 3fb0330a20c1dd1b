"""`gap viz`: a run dir as one self-contained HTML report (overview heatmaps, cells, trials with
their video and workflow graph, a comparison), or served on loopback for runs too big to inline.

`model.py` reads the run dir into pydantic models (pure; one trial's workflow graph is
`trace.py`'s, reading files confined to the run dir `files.py`'s), `html.py` writes the page,
`serve.py` serves it; the page's script and style live in `static/`.
"""
