"""Finding the keys with work without reading every key: the deadline index read earliest-due first,
searched by pattern with the operator's lists, and keys checked to hold nothing."""

from django_keyed_queue.gate import Finish, Start, Submission
from django_keyed_queue.gate.keys import KeyNames
from django_keyed_queue.gate.listing import glob_escape
from tests.gate_redis import DEADLINES, ON_CLUSTER, index_scores, set_index_scores


def test_every_key_with_a_holder_is_in_the_index_the_earliest_due_first(gate, gate_redis):
    gate.submit(Submission("granted", b"m"))
    started = gate.submit(Submission("running", b"m"))
    assert gate.start(Start("running", started.ticket, 1)).ok
    gate.submit(Submission("running", b"waits"))
    set_index_scores(gate_redis, DEADLINES, {"overdue": 1, "drained": 2})  # no holder: the reaper drops them later

    found = gate.indexed_keys(limit=100)

    assert found.keys[:2] == ["overdue", "drained"] and set(found.keys) == {"overdue", "drained", "granted", "running"}
    assert found.total == 4


def test_the_index_is_read_up_to_its_limit(gate, gate_redis):
    set_index_scores(gate_redis, DEADLINES, {f"k{n:03}": n for n in range(300)})
    found = gate.indexed_keys(limit=20)
    assert found.total == 300
    if ON_CLUSTER:  # the earliest of each shard: about as many, spread over them
        assert 20 <= len(found.keys) <= 20 + len(DEADLINES.names)
    else:
        assert found.keys == [f"k{n:03}" for n in range(20)]


def test_a_search_finds_keys_of_the_index_and_of_the_operator_s_lists(gate, gate_redis):
    gate.submit(Submission("ledger:1001", b"m"))
    gate.submit(Submission("ledger:21001", b"m"))
    gate.pause("paused:1001")
    gate.set_overrides("limited:1001", limit=2)
    gate.submit(Submission("other", b"m"))

    found = gate.keys_matching("*1001*", budget=10_000)

    assert found.keys == ["ledger:1001", "ledger:21001", "limited:1001", "paused:1001"] and found.complete


def test_a_search_takes_the_text_literally(gate):
    for key in ("a*b[1]", "aXb1", "a?b\\"):
        gate.submit(Submission(key, b"m"))
    assert gate.keys_matching("*" + glob_escape("a*b[1]") + "*", budget=10_000).keys == ["a*b[1]"]
    assert gate.keys_matching(glob_escape("a?b\\"), budget=10_000).keys == ["a?b\\"]


def test_a_search_examines_about_its_budget_and_says_it_stopped(gate, gate_redis):
    # Enough in each shard that one step does not read it through.
    many = {f"key:{n}": n for n in range(3000 * len(DEADLINES.names))}
    set_index_scores(gate_redis, DEADLINES, many)
    partial = gate.keys_matching("key:1*", budget=1000)
    whole = gate.keys_matching("key:1*", budget=10**6)
    assert not partial.complete and whole.complete
    assert set(partial.keys) < set(whole.keys) == {k for k in many if k.startswith("key:1")}
    assert len(index_scores(gate_redis, DEADLINES)) == len(many), "reads only"


def test_a_key_holds_nothing_once_drained_and_its_records_written(gate, gate_redis):
    sub = gate.submit(Submission("k", b"m", record=b"r"))
    parked = gate.submit(Submission("waits", b"m"))
    assert gate.holding_nothing(["k", "waits", "never"]) == {"never"}, "a granted ticket holds its key"
    started = gate.start(Start("k", sub.ticket, 1))
    gate.finish(Finish("k", sub.ticket, started.token))
    assert gate.holding_nothing(["k"]) == set(), "its submission's record is not written yet"
    gate_redis.delete(KeyNames("k").unwritten)
    assert gate.holding_nothing(["k", "waits"]) == {"k"}
    assert parked.ticket


def test_the_time_a_ticket_was_taken_is_kept_until_its_row_is_written(gate, gate_redis):
    sub = gate.submit(Submission("k", b"m", record=b"r"))
    now_ms = int(gate_redis.time()[0]) * 1000
    kept = gate.kept_since([("k", sub.ticket), ("k", 99), ("never", 1)])
    assert list(kept) == [("k", sub.ticket)] and abs(kept["k", sub.ticket] - now_ms) < 2000
    gate_redis.hset(KeyNames("k").unwritten, "99", b"not as submit keeps it")
    assert gate.kept_since([("k", 99)]) == {}, "passed by"
    gate_redis.delete(KeyNames("k").unwritten)  # as a writer does once the rows are written
    assert gate.kept_since([("k", sub.ticket)]) == {}


def test_stored_messages_are_read_by_ticket(gate):
    sub = gate.submit(Submission("k", b"the message"))
    assert gate.stored_messages([("k", sub.ticket), ("k", 7)]) == [b"the message", None]
    assert gate.stored_messages([]) == []


def test_snapshots_without_task_ids_get_them_later(gate):
    sub = gate.submit(Submission("k", b'{"id": "task-1"}'))
    [bare] = gate.inspect_many(["k"], task_ids=False)
    assert bare.holders[sub.ticket].task_id is None
    [named] = gate.with_task_ids([bare])
    assert named.holders[sub.ticket].task_id == "task-1"
