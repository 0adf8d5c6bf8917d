"""Gate.rebuild: a key lost with Redis restored from its records, in chunks whose work is bounded."""

from django_keyed_queue.gate import Code
from django_keyed_queue.gate.keys import KeyNames


def test_a_deep_key_is_restored_in_order_through_bounded_chunks(gate, gate_redis):
    waiting = [(ticket, f"m{ticket}".encode()) for ticket in range(3, 1303)]  # 1,300 tickets: three chunks
    rebuilt = gate.rebuild("deep", last_ticket=1302, waiting=waiting, limit=2)
    assert rebuilt.code is Code.OK and [(g.ticket, g.message) for g in rebuilt.granted] == [(3, b"m3"), (4, b"m4")]
    state = gate.inspect("deep", waiting_shown=3)
    assert (state.waiting, state.depth, state.last_ticket) == ([5, 6, 7], 1298, 1302)
    assert gate_redis.hget(KeyNames("deep").messages, 1302) == b"m1302"
    assert gate.submit("deep", b"new").ticket == 1303, "new tickets go on after the last one"
    assert not list(gate_redis.scan_iter(match="*rebuild*")), "the staging became the key's own"
    assert gate_redis.ttl(KeyNames("deep").queue) == -1, "and lost its expiry"


def test_a_rebuild_of_a_live_key_changes_nothing_and_drops_its_staging(gate, gate_redis):
    gate.submit("live", b"m1")
    before = gate_redis.lrange(KeyNames("live").queue, 0, -1), gate_redis.hgetall(KeyNames("live").messages)
    assert gate.rebuild("live", last_ticket=9, waiting=[(n, b"x") for n in range(2, 700)]).code is Code.EXISTS
    assert (gate_redis.lrange(KeyNames("live").queue, 0, -1), gate_redis.hgetall(KeyNames("live").messages)) == before
    assert not list(gate_redis.scan_iter(match="*rebuild*"))
