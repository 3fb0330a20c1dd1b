"""Hostile frames (issue 33, frames and replies), against real processes on loopback.

Server side: a real `gap policy serve hold` (openpi protocol; `--protocol vla-eval` is served by
vla-eval's own server and decoder, not ours) gets each crafted observation frame: it is refused
with one line (the peer's text frame and one line in the server's log, never a traceback), the
server's peak RSS grows by less than 256 MiB, only that connection closes, an honest client is
served next, and the server writes nothing but its log. A client that sends without waiting for
replies holds a bounded number of frames. Client side: our client (a process of its own, as a
trial uses it) against a hostile server: each crafted reply is a PolicyTransportError (an
infrastructure failure) in one line, with bounded memory. The inputs and the measuring are in
frame_doubles.py (bench/dos.py prints the same rows as a table).
"""

from __future__ import annotations

import re
import time

import msgpack
import numpy as np
import pytest
from vla_eval.protocol.messages import Message, MessageType, pack_message
from vla_eval.protocol.numpy_codec import set_image_format
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from pytest_gap.policies.client import PolicyClient
from pytest_gap.policies.wire import WireError, WireLimits, packb, unpack_vla, unpackb
from tests.attacks.frame_doubles import (
    CLIENT_ATTACKS,
    MIB,
    PEAK_LIMIT_MIB,
    PIPELINE_FRAMES,
    PIPELINE_HELD,
    PIPELINE_MIB,
    SERVER_ATTACKS,
    client_outcome,
    honest_client,
    peak_rss_mib,
    pipeline,
    policy_server,
    send_frame,
)


def _new_lines(served, since: int) -> list[str]:
    """The server's log lines after the first `since`, once it has written one (it logs as it
    refuses, before it answers)."""
    deadline = time.monotonic() + 5
    while len(served.lines()) <= since and time.monotonic() < deadline:
        time.sleep(0.05)
    return served.lines()[since:]


@pytest.mark.parametrize("name", list(SERVER_ATTACKS))
def test_our_server_refuses_a_hostile_frame_in_one_line_and_serves_the_next_client(name, tmp_path):
    attack = SERVER_ATTACKS[name]
    frame = attack.frame()
    with policy_server(tmp_path) as served:
        before, logged = peak_rss_mib(served.pid), len(served.lines())
        answer, code = send_frame(served.url, frame)
        growth = peak_rss_mib(served.pid) - before
        added = _new_lines(served, logged)

        assert code == 1011, answer  # that connection closes, as openpi's servers close it
        assert answer.startswith("WireError: ") and "\n" not in answer
        assert re.search(attack.refusal, answer), answer
        assert growth < PEAK_LIMIT_MIB, f"{name}: peak RSS grew {growth:.0f} MiB"
        assert len(added) == 1, added
        assert added[0].startswith("refused a frame from ('127.0.0.1', ")
        assert re.search(attack.refusal, added[0]), added[0]
        assert honest_client(served.url) == (10, 7)  # the next client is served
        log = served.log.read_text()
    assert "Traceback" not in log
    assert sorted(p.name for p in tmp_path.iterdir()) == ["server.log"]


def test_an_honest_frame_as_big_as_the_limit_is_still_served(tmp_path):
    big = {"observation/image": np.zeros(60 * MIB, np.uint8), "prompt": "pick up the milk"}
    with policy_server(tmp_path) as served:
        before = peak_rss_mib(served.pid)
        with PolicyClient(served.url, timeout_s=60) as client:
            assert client.infer(big)["actions"].shape == (10, 7)
        assert peak_rss_mib(served.pid) - before < PEAK_LIMIT_MIB
        assert served.lines() == []


def test_a_client_that_never_waits_for_replies_holds_a_bounded_number_of_frames(tmp_path):
    slow = "tests.attacks.frame_doubles:SlowHold"  # 1 s per inference: frames pile up
    flags = ("--max-message-mb", str(PIPELINE_MIB + 1))
    with policy_server(tmp_path, slow, *flags) as served:
        before = peak_rss_mib(served.pid)
        pipeline(served.url, PIPELINE_FRAMES, PIPELINE_MIB * MIB)
        growth = peak_rss_mib(served.pid) - before
        assert growth < PIPELINE_HELD * PIPELINE_MIB, (
            f"{PIPELINE_FRAMES} frames of {PIPELINE_MIB} MiB sent without waiting: peak RSS grew "
            f"{growth:.0f} MiB"
        )
        assert honest_client(served.url) == (10, 7)


@pytest.mark.parametrize("name", list(CLIENT_ATTACKS))
def test_our_client_refuses_a_hostile_server_as_an_infrastructure_failure(name):
    attack = CLIENT_ATTACKS[name]
    seen = client_outcome(attack)
    assert seen["raised"] == "PolicyTransportError" and seen["infra_failure"], seen
    assert "\n" not in seen["error"]
    assert re.search(attack.refusal, seen["error"]), seen["error"]
    assert seen["peak_rss_growth_mib"] < PEAK_LIMIT_MIB, seen


def test_real_observations_are_well_inside_the_bounds():
    """What the reference clients send decodes: openpi's LIBERO observation (two 224x224
    images, state, prompt) and vla-eval's (two 256x256 PNGs, state), an action chunk."""
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (224, 224, 3), dtype=np.uint8)
    obs = {
        "observation/image": image,
        "observation/wrist_image": image,
        "observation/state": np.zeros(8, np.float32),
        "prompt": "put both the alphabet soup and the tomato sauce in the basket",
    }
    assert np.array_equal(unpackb(packb(obs))["observation/wrist_image"], image)
    frames = rng.integers(0, 255, (256, 256, 3), dtype=np.uint8)
    payload = {"images": {"agentview": frames, "wrist": frames}, "states": np.zeros(8)}
    back = unpack_vla(pack_message(Message(MessageType.OBSERVATION, payload)))["payload"]
    assert np.array_equal(back["images"]["wrist"], frames)
    big = np.zeros((4096, 4096, 3), np.uint8)  # the largest image the bound takes
    back = unpack_vla(pack_message(Message(MessageType.ACTION, {"image": big})))["payload"]
    assert back["image"].shape == (4096, 4096, 3)


def _array_of(count: int, item: bytes) -> bytes:
    return b"\xdd" + count.to_bytes(4, "big") + item * count


def _nested(depth: int) -> bytes:
    return b"\x91" * depth + b"\xc0"


SMALL = WireLimits(max_objects=1000, max_depth=8, max_str_bytes=64)
# id -> (a frame, whether SMALL takes it); each bound at its edge, through any container kind
EDGES = {
    "objects at the bound": (_array_of(999, b"\xc0"), True),
    "objects over the bound": (_array_of(1000, b"\xc0"), False),
    "objects over the bound, in maps": (_array_of(334, b"\x81\xa1k\x80"), False),
    "objects over the bound, counted across containers": (_array_of(400, b"\x92\x90\x90"), False),
    "depth at the bound": (_nested(8), True),
    "depth over the bound": (_nested(9), False),
    "depth over the bound, empty innermost": (b"\x91" * 8 + b"\x90", False),
    "depth over the bound, in maps": (b"\x81\xa1k" * 9 + b"\xc0", False),
    "string at the bound": (msgpack.packb("x" * 62), True),
    "string over the bound": (msgpack.packb("x" * 65), False),
    "extension type": (msgpack.packb([msgpack.ExtType(5, b"abcd")]), False),
    "timestamp extension": (msgpack.packb({"t": msgpack.Timestamp(0, 0)}), False),
}


@pytest.mark.parametrize("case", list(EDGES))
def test_each_bound_is_checked_at_its_edge_whatever_the_container(case):
    """The frame counts as the one object that holds the rest: 999 nils in an array are 1000."""
    frame, taken = EDGES[case]
    # the same structure as a vla-eval message's payload: one level and five objects more
    message = b"\x84\xa4type\xa6action\xa3seq\x00\xa9timestamp\x00\xa7payload" + frame
    if taken:
        unpackb(frame, "frame", SMALL)
        return
    with pytest.raises(WireError, match=r"^frame: (holds|nests)") as refused:
        unpackb(frame, "frame", SMALL)
    assert "\n" not in str(refused.value)
    with pytest.raises(WireError, match=r"^message: (holds|nests)"):
        unpack_vla(message, SMALL)


def vla_payload(**fields) -> bytes:
    return msgpack.packb({"type": "action", "payload": fields, "seq": 0}, use_bin_type=True)


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ({"__image__": True, "format": "gif", "data": b"GIF89a"}, "image format 'gif' is not png"),
        ({"__image__": True, "format": "bmp", "data": b"BM"}, "image format 'bmp' is not png"),
        (
            {"__image__": True, "format": "raw", "data": bytes(3), "dtype": "u1", "shape": [10**9]},
            r"data is 3 bytes but shape \[1000000000\]",
        ),
        (
            {"__ndarray__": True, "data": b"\0" * 4, "dtype": "<f4" + " " * 40, "shape": [1]},
            "characters, over the wire format's 32",
        ),
        (
            {"__ndarray__": True, "data": b"\0" * 8, "dtype": "<M8[s]", "shape": [1]},
            "allowed kinds: biuf",
        ),
    ],
)
def test_vla_eval_images_and_arrays_outside_the_allow_lists_are_refused(bad, reason):
    with pytest.raises(WireError, match=rf"^message\['payload'\]\['x'\]: .*{reason}"):
        unpack_vla(vla_payload(x=bad))


def test_a_jpeg_is_read_as_vla_eval_sends_it_and_checked_the_same_way():
    image = np.zeros((32, 48, 3), np.uint8)
    set_image_format("jpeg")
    try:
        frame = pack_message(Message(MessageType.ACTION, {"x": image}))
    finally:
        set_image_format("png")
    assert unpack_vla(frame)["payload"]["x"].shape == (32, 48, 3)
    tiny = WireLimits(max_image_side=40)
    with pytest.raises(WireError, match=r"jpeg image claims 48x32 pixels, over .* 40x40"):
        unpack_vla(frame, tiny)


def test_the_vla_eval_protocol_server_decodes_within_the_same_bounds(tmp_path):
    """`gap policy serve --protocol vla-eval` is vla-eval's own server; pytest-gap puts its
    bounded decoding in front of vla-eval's decoder (and a frame limit on its websocket layer):
    the empty-maps frame (213 MiB of Python objects from 2.9 MiB) is refused in one line, that
    connection alone closes, and an honest vla-eval client is served next."""
    from pytest_gap.policies.client import VlaEvalClient
    from tests.attacks.frame_doubles import empty_maps

    with policy_server(tmp_path, "hold", "--protocol", "vla-eval") as served:
        before = peak_rss_mib(served.pid)
        with connect(served.url, compression=None, max_size=None, open_timeout=30) as ws:
            ws.send(empty_maps())
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=60)
        growth = peak_rss_mib(served.pid) - before
        assert growth < PEAK_LIMIT_MIB, f"peak RSS grew {growth:.0f} MiB"
        refused = [line for line in served.lines() if "refused a frame" in line]
        assert len(refused) == 1 and "Traceback" not in served.log.read_text(), served.lines()
        with VlaEvalClient(served.url, timeout_s=60) as client:
            frames = np.zeros((256, 256, 3), np.uint8)
            reply = client.infer({"images": {"agentview": frames}, "task_description": "x"})
        assert np.asarray(reply["actions"]).shape[-1] == 7


def test_bench_dos_prints_each_rows_cost_within_the_bounds():
    """bench/dos.py (and `bench/faults.py --dos`) in its smallest form: the empty-maps rows of
    both servers and of our clients, each within the bounds (exit 0)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, str(root / "bench" / "dos.py"), "--only", "empty maps"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if "empty maps" in line]
    sides = [row.split(" | ")[1] for row in rows]
    assert sides[:2] == ["server", "vla-eval server"] and len(rows) >= 3, done.stdout
