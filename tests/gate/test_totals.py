"""The deployment's totals: what many clients add at once is summed exactly, on one server or a cluster."""

import threading

from django_keyed_queue.gate import Gate


def test_adds_from_many_clients_at_once_are_summed_exactly(gate, make_gate):
    gates = [make_gate() for _ in range(4)]

    def add(g: Gate) -> None:
        for _ in range(50):
            g.add_totals({"a": 1, "b": 2, "s": 0.25}, {"task": "t:{x}"})

    threads = [threading.Thread(target=add, args=(g,)) for g in gates]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    amounts, templates = gate.totals()
    assert (int(amounts["a"]), int(amounts["b"]), float(amounts["s"])) == (200, 400, 50.0)
    assert templates == {"task": "t:{x}"}


def test_nothing_to_add_sends_nothing_and_an_empty_deployment_reads_empty(gate):
    gate.add_totals({}, {})
    assert gate.totals() == ({}, {})


def test_unicode_and_nul_field_names_and_templates_round_trip(gate):
    field, template = '["submitted","t\x00é\U0001f600","",""]', "k:{a}\x00✓"
    gate.add_totals({field: 3}, {"t\x00é": template})
    amounts, templates = gate.totals()
    assert amounts == {field: "3"} and templates == {"t\x00é": template}
