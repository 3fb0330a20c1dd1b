"""Evaluation as a service: the simulator runs here, a team's policy runs elsewhere as a client.

`gap serve` (server.py) holds runs under a runs dir; `gap submit` schedules a benchmark config's
trials under a run id; clients (`gap eval`, or `EvalClient` in client.py) attach with that run id
and a worker id and answer each observation with actions; `gap status` reports where a run is.
Records land in `<runs dir>/<run id>/` in the harness's own layout, so summaries, `gap viz` and
`gap compare` read them like any pytest run. protocol.py has the messages both sides speak;
runs.py keeps each run on disk and which of its trials are out with a client; slots.py and
relay.py are the attached clients (a simulator slot each, and the relay that makes the client a
policy server); limits.py and work.py bound what a run and its clients may take.

`gap online serve` hands such servers out per task: platform.py queues the tasks token holders
create and starts a `gap serve` for each as capacity allows; online.py is its HTTP API.
"""
