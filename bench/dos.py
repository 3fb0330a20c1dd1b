"""What hostile frames cost: each attack of tests/attacks/frame_doubles.py, measured.

    python bench/dos.py [--only TEXT]

Server rows: a real `gap policy serve hold` per row (openpi protocol, default 64 MiB frame
limit) gets the crafted observation frame; then an honest client connects. One row sends the
empty-maps frame to `--protocol vla-eval` (vla-eval's own server, bounded decoding in front).
Client rows: our client, in a process of its own, as a trial uses it, against a server
answering with the crafted frame. The pipeline row: a client that sends twenty 16 MiB frames
without waiting for replies to a server whose policy takes 1 s (`--max-message-mb 17`). Each
row prints:

    input | side | frame MiB | peak RSS growth MiB | outcome | log lines | next client

- peak RSS growth: the process's VmHWM after minus before (/proc/PID/status), MiB.
- outcome: the refusal (the server's text frame, the client's exception), or what happened.
- log lines: the server's stderr lines the attack added (one: the refusal).
- next client: an honest client's action shape on a new connection ("-" for client rows).

Not a fault of bench/faults.py: those rows are real runs that must lose no trial; these are
single frames whose cost is memory. Exit status 1 if a row breaks the bounds the tests assert
(server: growth < 256 MiB, one log line, next client served; pipeline: growth under eight
frames' worth; client: an infrastructure failure in one line, growth < 256 MiB).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.attacks.frame_doubles import (  # noqa: E402
    CLIENT_ATTACKS,
    MIB,
    PEAK_LIMIT_MIB,
    PIPELINE_FRAMES,
    PIPELINE_HELD,
    PIPELINE_MIB,
    SERVER_ATTACKS,
    client_outcome,
    empty_maps,
    honest_client,
    peak_rss_mib,
    pipeline,
    policy_server,
    send_frame,
)


def _short(text: str, limit: int = 110) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def server_row(name: str, frame: bytes) -> tuple[list[str], bool]:
    with tempfile.TemporaryDirectory() as tmp, policy_server(Path(tmp)) as served:
        before, lines0 = peak_rss_mib(served.pid), len(served.lines())
        t0 = time.perf_counter()
        answer, code = send_frame(served.url, frame)
        seconds = time.perf_counter() - t0
        time.sleep(0.3)  # the log line is written as the connection closes
        growth, added = peak_rss_mib(served.pid) - before, served.lines()[lines0:]
        try:
            following = str(honest_client(served.url))
        except Exception as exc:
            following = f"not served: {type(exc).__name__}"
    ok = growth < PEAK_LIMIT_MIB and len(added) == 1 and following == "(10, 7)"
    outcome = f"{_short(answer)} (close {code}, {seconds:.2f} s)"
    cells = [name, "server", f"{len(frame) / MIB:.1f}", f"{growth:.0f}", outcome, str(len(added))]
    return [*cells, following], ok


def vla_eval_server_row(name: str, frame: bytes) -> tuple[list[str], bool]:
    """A frame to `gap policy serve hold --protocol vla-eval` (vla-eval's own server, with
    wire.py's bounded decoding in front of its decoder); the next client is a vla-eval one."""
    import numpy as np
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    from pytest_gap.policies.client import VlaEvalClient

    flags = ("--protocol", "vla-eval")
    with tempfile.TemporaryDirectory() as tmp, policy_server(Path(tmp), "hold", *flags) as srv:
        before = peak_rss_mib(srv.pid)
        t0 = time.perf_counter()
        with connect(srv.url, compression=None, max_size=None, open_timeout=30) as ws:
            ws.send(frame)
            try:
                ws.recv(timeout=60)
                outcome = "answered"
            except ConnectionClosed as exc:
                outcome = f"closed ({exc.rcvd.code if exc.rcvd else '-'})"
        seconds = time.perf_counter() - t0
        time.sleep(0.3)
        growth = peak_rss_mib(srv.pid) - before
        refused = [line for line in srv.lines() if "refused a frame" in line]
        try:
            with VlaEvalClient(srv.url, timeout_s=60) as client:
                obs = {"images": {"agentview": np.zeros((8, 8, 3), np.uint8)}}
                following = str(np.asarray(client.infer(obs)["actions"]).shape)
        except Exception as exc:
            following = f"not served: {type(exc).__name__}"
    ok = growth < PEAK_LIMIT_MIB and len(refused) == 1 and following.endswith("7)")
    outcome = f"{_short(refused[0] if refused else outcome)} ({seconds:.2f} s)"
    cells = [name, "vla-eval server", f"{len(frame) / MIB:.1f}", f"{growth:.0f}", outcome]
    return [*cells, str(len(refused)), following], ok


def pipeline_row() -> tuple[list[str], bool]:
    flags = ("--max-message-mb", str(PIPELINE_MIB + 1))
    policy = "tests.attacks.frame_doubles:SlowHold"
    with tempfile.TemporaryDirectory() as tmp, policy_server(Path(tmp), policy, *flags) as srv:
        before = peak_rss_mib(srv.pid)
        pipeline(srv.url, PIPELINE_FRAMES, PIPELINE_MIB * MIB)
        growth = peak_rss_mib(srv.pid) - before
        following = str(honest_client(srv.url))
    name = f"{PIPELINE_FRAMES} x {PIPELINE_MIB} MiB frames, no waiting for replies"
    bound = PIPELINE_HELD * PIPELINE_MIB  # a few frames' worth, however many are sent
    ok = growth < bound and following == "(10, 7)"
    outcome = f"held {growth / PIPELINE_MIB:.1f} frames' worth (bound: {bound} MiB)"
    size = f"{PIPELINE_FRAMES * PIPELINE_MIB:.1f}"
    return [name, "server", size, f"{growth:.0f}", outcome, "-", following], ok


def client_row(name: str) -> tuple[list[str], bool]:
    attack = CLIENT_ATTACKS[name]
    size = sum(len(f) for f in [*attack.greeting(), *attack.replies()] if f) / MIB
    seen = client_outcome(attack)
    growth = seen.get("peak_rss_growth_mib", float("nan"))
    if seen["raised"]:
        outcome = f"{seen['raised']}: {_short(seen['error'])}"
    else:
        outcome = f"accepted: reply {seen.get('reply_keys')}"
    ok = bool(seen.get("infra_failure")) and "\n" not in (seen["error"] or "")
    ok = ok and growth < PEAK_LIMIT_MIB
    side = f"client ({attack.protocol})"
    return [name, side, f"{size:.1f}", f"{growth:.0f}", outcome, "-", "-"], ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="rows whose input contains this text")
    args = parser.parse_args(argv)
    rows: list[tuple[list[str], bool]] = []
    for name, attack in SERVER_ATTACKS.items():
        if not args.only or args.only in name:
            rows.append(server_row(name, attack.frame()))
    if not args.only or args.only in "empty maps":
        rows.append(vla_eval_server_row("2.9 MiB of empty maps", empty_maps()))
    if not args.only or args.only in "pipeline":
        rows.append(pipeline_row())
    for name in CLIENT_ATTACKS:
        if not args.only or args.only in name:
            rows.append(client_row(name))
    header = ["input", "side", "frame MiB", "peak RSS growth MiB", "outcome", "log lines"]
    print("| " + " | ".join([*header, "next client"]) + " |")
    print("|" + "---|" * (len(header) + 1))
    for cells, ok in rows:
        print("| " + " | ".join(cells) + (" |" if ok else " | OVER A BOUND |"))
    return 0 if all(ok for _, ok in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
