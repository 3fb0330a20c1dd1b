"""docs/tutorials/ab-compare.md, followed top to bottom (tests/tutorial_pages.py), and what its
run must hold beyond the lines the page shows: the real A/B run of the scripted oracle against
the random baseline, each on its own managed server, read through `gap compare` (moved here
from test_compare.py, which ran the same two-policy session a second time)."""

import subprocess

import pytest

from pytest_gap.results import scan_results
from tests.test_compare import GAP, _json
from tests.tutorial_pages import follow

A, B = "policy_only@ckpt-a", "policy_only@ckpt-b"


def test_the_ab_compare_tutorial_runs_top_to_bottom_and_compares_real_pairs(tmp_path, capsys):
    follow("ab-compare", tmp_path)
    (run,) = (tmp_path / "runs").iterdir()
    records = scan_results(run)
    assert len(records) == 4 and not any(r.errored for r in records.values())
    wins = {
        p: sum(r.success for r in records.values() if r.policy_id == p)
        for p in ("ckpt-a", "ckpt-b")
    }
    assert wins["ckpt-a"] > wins["ckpt-b"], wins  # counts that cannot be a table of zeros

    # Two pairs can never make B significantly worse (the smallest McNemar p with two
    # discordant pairs is 0.5): exit 0, and the table's counts are the session's own.
    done = subprocess.run(
        [GAP, "compare", str(run), "--a", A, "--b", B], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"A  {A}[privileged]  ({run})"
    row = next(line for line in lines if line.startswith("libero/object")).split()
    assert row[1:4] == ["2", f"{wins['ckpt-a']}/2", f"{wins['ckpt-b']}/2"]
    assert row[4] == f"{(wins['ckpt-b'] - wins['ckpt-a']) / 2:+.3f}"
    assert lines[-1] == "B is not significantly worse than A anywhere (Holm, alpha 0.05)"
    # Provenance is in every record, so every check ran (no note says one was skipped): the
    # pairs started from the same sim states, on one plan and harness, from two servers.
    assert not any(line.startswith("note: not recorded") for line in lines), done.stdout
    by_policy = {
        p: sorted(
            (r.seed, r.init_state_digest, r.policy_url)
            for r in records.values()
            if r.policy_id == p
        )
        for p in ("ckpt-a", "ckpt-b")
    }
    for (seed_a, digest_a, url_a), (seed_b, digest_b, url_b) in zip(
        by_policy["ckpt-a"], by_policy["ckpt-b"], strict=True
    ):
        assert seed_a == seed_b and digest_a == digest_b and digest_a
        assert url_a and url_b and url_a != url_b
    assert len({r.plan_digest for r in records.values()}) == 1
    # the other way round, in-process (a second `gap` would import scipy again)
    capsys.readouterr()
    code, data = _json(capsys, run, "--a", B, "--b", A)
    assert code == 0, data
    assert data["b"]["row"] == f"{A}[privileged]"
    assert data["pooled"]["diff"] == pytest.approx((wins["ckpt-a"] - wins["ckpt-b"]) / 2)
