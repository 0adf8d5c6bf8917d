from django_keyed_queue.gate import Code


def test_submit_start_finish(gate):
    a = gate.submit("k", b"m1")
    b = gate.submit("k", b"m2")
    assert a.granted and not b.granted
    started = gate.start("k", a.ticket, 1)
    assert started.ok
    done = gate.finish("k", a.ticket, started.token)
    assert done.ok and [g.ticket for g in done.granted] == [b.ticket]
    assert gate.start("k", a.ticket, 1).code is Code.NOT_GRANTED
