"""Twins, proven against the reference's own code (issue 32 section 3): one recorded open-loop
episode replayed over vla-eval's protocol gives the same outcome at the same step, from the same
scene, through the libero backend's policy_only_bare and through vla-eval's own LIBERO loop
(LIBEROBenchmark + SyncEpisodeRunner: the vla-eval backend), and the server receives the same
messages from both (issue 48 section 6). The replay is served by vla-eval's own model server
class logging what it receives (bench/twin.py `logged_replay`) for the two-object episode, and by
a managed `gap policy serve replay --protocol vla-eval` for the whole sessions.

The episodes are long enough for what used to differ: a release before the end and a second
grasp (libero_10 task 0: two cans into one basket; policy_only_bare used to end at the first
release), a fixture's place (libero_goal task 0: the middle drawer of the cabinet LIBERO
jitters at every reset, opened by its handle; vla-eval used to draw that jitter from a stream
shared by every episode of its env). The recordings are the privileged oracle's and the do_task
graph's own actions. Each episode runs through both loops once: the two-object one by calling
the backends, the fixture one through whole pytest sessions (which call the same backends; a
third, one-object episode would replay nothing the other two do not). bench/twin.py prints the
same comparison as a table, for any episodes."""

from __future__ import annotations

from bench.twin import Episode, first_difference, in_session, message_twins, record, zero_closes


def _same(*outcomes) -> set[tuple]:
    return {(o.success, o.steps, o.scene_digest) for o in outcomes}


def test_both_loops_replay_an_episode_to_the_same_outcome_with_the_same_messages():
    """Two cans into one basket: a release, then a second grasp, with every close command
    written as exactly 0 (vla-eval snaps 0 to close, and so must the vla-eval-libero format).
    Served by vla-eval's own model server class, which logs what it receives: both loops send it
    the same messages (issue 48 section 6), the task at EPISODE_START, one observation per step
    to the bit, the result at EPISODE_END (its wall time aside). That the budget ends both
    streams alike, tests/test_vla_eval_backend.py shows (this episode ends by success)."""
    episode = Episode.parse("libero_10:0:0")
    actions, recorded = record(episode)
    assert recorded.success, "the recording itself must succeed"
    assert (actions[:, 6] > 0).any() and (actions[:, 6] < 0).any()
    actions = zero_closes(actions)
    releases = ((actions[:-1, 6] >= 0) & (actions[1:, 6] < 0)).sum()
    assert releases >= 2  # one can released into the basket before the other is grasped
    outcomes, mine, theirs = message_twins(episode, actions)
    assert _same(*outcomes.values(), recorded) == {(True, recorded.steps, recorded.scene_digest)}
    assert first_difference(mine, theirs) is None
    # What vla-eval's loop sends, read from its stream (and so from ours).
    kinds = [kind for kind, _ in theirs]
    assert kinds == ["episode_start", *["observation"] * recorded.steps, "episode_end"]
    (_, start), (_, first), (_, end) = theirs[0], theirs[1], theirs[-1]
    assert start == {
        "task": {
            "name": first["task_description"],
            "suite": "libero_10",
            "task_id": 0,
            "episode_idx": 0,
        }
    }
    assert set(first) == {"images", "task_description", "states", "controller_states"}
    assert end["metrics"] == {"success": True} and end["steps"] == recorded.steps
    assert isinstance(end["elapsed_sec"], float)


def test_whole_sessions_on_both_backends_are_twins_on_a_jittered_fixture(tmp_path):
    """`gap benchmark`'s path on each backend (config, plan, runner, a managed
    `gap policy serve replay --protocol vla-eval`, the warm-up, result.json) on an episode
    that acts on a fixture LIBERO jitters at every reset: the cabinet's middle drawer opened by
    its handle, recorded from the do_task skill graph (bench/twin.py runs the wine bottle onto
    the same cabinet too)."""
    episode = Episode.parse("libero_goal:0:0:examples/workflows/do_task")
    actions, recorded = record(episode)
    assert recorded.success, "the recording itself must succeed"
    sides = {b: in_session(episode, actions, b, tmp_path / b) for b in ("libero", "vla-eval")}
    assert _same(*sides.values(), recorded) == {(True, recorded.steps, recorded.scene_digest)}
