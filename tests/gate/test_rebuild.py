"""Gate.rebuild: a key lost with Redis restored from its records, in chunks whose work is bounded."""

import json

from django_keyed_queue.gate import Code, Finish, Submission
from django_keyed_queue.gate.keys import KeyNames


def test_a_deep_key_is_restored_in_order_through_bounded_chunks(gate, gate_redis):
    waiting = [(ticket, f"m{ticket}".encode()) for ticket in range(3, 1303)]  # 1,300 tickets: three chunks
    rebuilt = gate.rebuild("deep", last_ticket=1302, waiting=waiting, limit=2)
    assert rebuilt.code is Code.OK and [(g.ticket, g.message) for g in rebuilt.granted] == [(3, b"m3"), (4, b"m4")]
    state = gate.inspect("deep", waiting_shown=3)
    assert (state.waiting, state.depth, state.last_ticket) == ([5, 6, 7], 1298, 1302)
    assert gate_redis.hget(KeyNames("deep").messages, 1302) == b"m1302"
    assert gate.submit(Submission("deep", b"new")).ticket == 1303, "new tickets go on after the last one"
    assert not list(gate_redis.scan_iter(match="*rebuild*")), "the staging became the key's own"
    assert gate_redis.ttl(KeyNames("deep").queue) == -1, "and lost its expiry"


def test_a_rebuild_of_a_live_key_changes_nothing_and_drops_its_staging(gate, gate_redis):
    gate.submit(Submission("live", b"m1"))
    before = gate_redis.lrange(KeyNames("live").queue, 0, -1), gate_redis.hgetall(KeyNames("live").messages)
    assert gate.rebuild("live", last_ticket=9, waiting=[(n, b"x") for n in range(2, 700)]).code is Code.EXISTS
    assert (gate_redis.lrange(KeyNames("live").queue, 0, -1), gate_redis.hgetall(KeyNames("live").messages)) == before
    assert not list(gate_redis.scan_iter(match="*rebuild*"))


def message(task_id: str) -> bytes:
    return json.dumps({"id": task_id}).encode()


def test_tasks_restored_into_a_live_key_go_after_its_holders_and_before_its_waiting_tickets(gate, gate_redis):
    holder = gate.submit(Submission("live", message("new-1"), task_id="new-1", start=True))
    waiting = [
        gate.submit(Submission("live", message(f"new-{n}"), task_id=f"new-{n}", coalesce="" if n == 2 else "sync"))
        for n in (2, 3)
    ]
    assert [w.ticket for w in waiting] == [2, 3]
    names = KeyNames("live")
    gate_redis.hset(names.unwritten, 3, b"w|1|the record of new-3")

    restored = gate.restore_ahead("live", messages=[message("old-7"), message("old-8")], limit=1)

    assert restored.ok and restored.tickets == [4, 5] and restored.renumbered == {2: 6, 3: 7}
    assert restored.granted == [], "the holder keeps the key's one slot"
    state = gate.inspect("live", waiting_shown=10)
    assert state.waiting == [4, 5, 6, 7] and state.last_ticket == 7 and list(state.holders) == [1]
    assert [gate_redis.hget(names.messages, t) for t in (4, 5, 6, 7)] == [
        message("old-7"), message("old-8"), message("new-2"), message("new-3")
    ]  # fmt: skip
    assert gate_redis.hget(names.messages, 2) is None
    assert gate_redis.hget(names.unwritten, 7) == b"w|1|the record of new-3"
    assert gate_redis.hget(names.recent, "new-3") == b"7" and gate_redis.hget(names.meta, "coalesce:sync") == b"7"
    assert gate.held_task_ids("live") == {"new-1", "new-2", "new-3", "old-7", "old-8"}

    finished = gate.finish(Finish("live", 1, holder.token))
    assert [(g.ticket, g.message) for g in finished.granted] == [(4, message("old-7"))], "the restored go first"
    assert not list(gate_redis.scan_iter(match="*rebuild*")), "the staging is gone"


def test_restoring_ahead_in_a_key_with_no_state_changes_nothing(gate, gate_redis):
    assert gate.restore_ahead("gone", messages=[message("old-1")]).code is Code.NOT_GRANTED
    assert not list(gate_redis.scan_iter(match="*gone*"))
