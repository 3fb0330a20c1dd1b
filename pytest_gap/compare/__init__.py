"""`gap compare`: is B worse than A, and where. Paired statistics over recorded trials, as pure
functions over TrialResults; the CLI (`gap compare`) only loads run dirs and prints.

Sides. A side is one row of a run dir, as the terminal pivot labels it (`mode@policy_id`,
`[privileged]` optional): two rows of one run (`gap compare RUN --a ROW --b ROW`), or one row of
each of two runs (`gap compare RUN_A RUN_B`; `--a`/`--b` pick the row where a run has several).

Pairs. A trial of A and a trial of B are a pair when they ran the same episode: the same
(backend, family, variation, task, seed). A pair with an errored trial on either side
(an infrastructure failure or a trial the harness could not run) is excluded from both sides
and counted; trials without a partner are counted and left out.

Refusals (exit 2, one line each, naming what differs and the fix), all reported at once:
- a pair whose two initial sim states differ (init_state_digest, when both are known): the
  sides did not run the same episodes;
- a pair whose two settled scenes differ (scene_digest, when both are known): the same seed
  placed the fixtures otherwise (a harness that drew their jitter from another stream);
- a pair whose harness_surface differs (code and packages that decide outcomes): the changed
  files come from the two run_manifest.json; `--allow-harness-mismatch` turns it into a note;
- different plans for the paired part (see `plan_problems`);
- a pair answered by one server URL on both sides: a policy compared with itself gives a
  difference near zero with every check passing;
- no scored pair at all.
Provenance a record does not carry (records written before it was recorded) is unknown: the
check is skipped and the output says which fields were missing.

Statistics, per cell (family/variation) and pooled over every pair:
- success of A and of B (k/n over the scored pairs) and the difference B - A;
- McNemar's exact test: under "no difference" the discordant pairs (A only succeeded: `a_only`,
  B only succeeded: `b_only`) split 50/50, so p = binomtest(a_only, a_only + b_only, 0.5),
  two-sided; 1.0 with no discordant pair;
- a 95% interval for the difference from a percentile bootstrap that resamples whole tasks
  (the clusters: the seeds of one task share a scene and a prompt, they are not independent
  draws), with a fixed seed so the same records give the same interval;
- Holm's step-down adjustment over the cells; with two or more cells the pooled row joins the
  family, since it can fail the comparison too.
Exit 0 when no row says B is significantly worse after Holm, 1 when one does.

`--controls` pairs each perturbed cell of B (posvar, LIBERO-PRO variants) with the control arm
its family declares, in A (one run: the same row by default), by (task, seed): the init-state
and scene digests differ there by design, so the records' init state indices are compared
instead, and one policy on both sides is expected. B-A is minus the drop the perturbation
costs; exit 1 when it is significantly negative.

`--sequential` reads each cell instead as an anytime-valid sequential test, block by block
(`sequential_ab`): B worse, B better, B not worse within a margin, or undecided; valid on runs
still running or stopped early, however often it is read. Only B worse exits 1.

The modules, bottom to top (each imports only those before it, never this package):
`wording` (how messages name digests and lists), `pairing` (run dirs, sides, pairs),
`controls` (`--controls`: perturbed cells paired with their declared control arms), `plans`
and `refusals` (what refuses a comparison), `stats` (the numbers), `noninferiority` (paired
tests against a margin: Tango's, and the e-values), `sequential_ab` (`--sequential`),
`comparison` (`compare`), `table` (`render`). This package re-exports what the CLI, the
report viewer and tests use.

scipy and statsmodels are imported inside the functions that use them (seconds to import).
"""

from __future__ import annotations

from pytest_gap.compare.comparison import CompareRefused, Comparison, compare
from pytest_gap.compare.pairing import (
    PRIVILEGED,
    Pair,
    Pairing,
    RunDir,
    Side,
    base_row,
    load_run,
    pair,
    row_of,
    select,
)
from pytest_gap.compare.plans import paired_plan, plan_problems
from pytest_gap.compare.refusals import refusals, surface_changes
from pytest_gap.compare.stats import (
    ALPHA,
    RowStats,
    cluster_interval,
    holm,
    mcnemar_p,
    row_stats,
    statistics,
)
from pytest_gap.compare.table import HEADERS, render

__all__ = [
    "ALPHA",
    "HEADERS",
    "PRIVILEGED",
    "CompareRefused",
    "Comparison",
    "Pair",
    "Pairing",
    "RowStats",
    "RunDir",
    "Side",
    "base_row",
    "cluster_interval",
    "compare",
    "holm",
    "load_run",
    "mcnemar_p",
    "pair",
    "paired_plan",
    "plan_problems",
    "refusals",
    "render",
    "row_of",
    "row_stats",
    "select",
    "statistics",
    "surface_changes",
]
