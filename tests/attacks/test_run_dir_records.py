"""What a run dir holds is read as records only when it is one: a `result.json` that is a FIFO
(which would block every reader: `gap viz`, the summary, resume), a symlink out of the run dir
(another file's content in the report) or a huge file is not a record."""

from __future__ import annotations

import os

from pytest_gap.layout import RESULT_FILE
from pytest_gap.results import Corrupt, read_result, scan_results


def test_a_fifo_a_symlink_or_a_huge_file_is_no_record(tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text('{"secret": "not a record"}')
    run = tmp_path / "run"
    for name in ("fifo", "link", "huge"):
        (run / name).mkdir(parents=True)
    os.mkfifo(run / "fifo" / RESULT_FILE)
    (run / "link" / RESULT_FILE).symlink_to(outside)
    with open(run / "huge" / RESULT_FILE, "wb") as huge:
        huge.truncate(17 * 2**20)
    assert read_result(run / "fifo") is None  # not opened: opening a FIFO blocks
    for name in ("link", "huge"):
        found = read_result(run / name)
        assert isinstance(found, Corrupt) and "secret" not in found.problem, found
    assert scan_results(run) == {}
