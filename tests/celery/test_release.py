"""An operator releases a hung run on real workers: it is fenced, runs again, and its key moves on."""

import pytest

from django_keyed_queue.gate import RecoveryAction
from django_keyed_queue.ops.actions import recovery
from django_keyed_queue.records.models import KeyedTask
from testproject.demo.history import read as read_history
from testproject.demo.tasks import lingering_step, step
from tests.waiting import wait_for_records, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.workers]


def test_a_released_hung_run_is_fenced_and_its_key_moves_on(workers, gate_redis):
    hung = lingering_step.delay("r", 1, 4.0)  # its first attempt hangs 4 s while its lease is renewed
    after = step.delay("r", 2)
    running = wait_until(
        lambda: KeyedTask.objects.filter(task_id=hung.id, status="running").first(), 20, message="the hung run"
    )
    [recovered] = [r for r in recovery.release("r", running.ticket, by="tester") if r.ticket == running.ticket]
    assert recovered.action is RecoveryAction.REDISPATCH

    records = wait_for_records([hung.id, after.id], timeout=30)
    wait_until(lambda: len([e for e in read_history() if e["event"] == "end"]) == 3, 15, message="the hung run's end")
    events = read_history()
    ends = {e["attempt"]: e for e in events if e["n"] == 1 and e["event"] == "end"}
    assert ends[1]["holds"] is False, "the released run learns it no longer holds its key"
    assert ends[2]["holds"] is True
    position = {(e["event"], e["n"], e.get("attempt")): i for i, e in enumerate(events)}
    assert position[("end", 1, 2)] < position[("start", 2, None)], "the next task waited for the new run"
    assert position[("start", 2, None)] < position[("end", 1, 1)], "but not for the fenced one"
    assert (records[hung.id].status, records[hung.id].attempts) == ("succeeded", 2)
    # The overlap shows on the record, which holds both attempts: the release, then how long they overlapped.
    notes = wait_until(lambda: len(n := KeyedTask.objects.get(task_id=hung.id).notes.splitlines()) == 2 and n, 10)
    released, ran_on = notes
    assert released.startswith("attempt 1 on "), released
    assert ": released by tester; dispatched again; it may still run: " in released
    assert ran_on.startswith("attempt 1 ran on after it lost its key: ") and " beside attempt 2 (started " in ran_on
    assert records[after.id].status == "succeeded"
