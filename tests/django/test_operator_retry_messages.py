"""An operator's retry runs a failed task once, and only with the task's own stored message; a rebuild
restores only messages of their own rows (G8)."""

import threading

import pytest
from django.db import connection

from django_keyed_queue.exceptions import ActionRefused
from django_keyed_queue.messaging.message import TaskMessage, gate_message
from django_keyed_queue.ops.actions import rebuild, recovery
from django_keyed_queue.records.models import KeyedTask
from django_keyed_queue.testing import write_submission_rows
from testproject.demo.tasks import charge, step
from tests.django.queues import QUEUE

pytestmark = pytest.mark.django_db(transaction=True)


def failed(*calls: tuple) -> list[KeyedTask]:
    """Rows of ``charge`` calls, each marked failed as a worker would."""
    results = [charge.apply_async(call, queue=QUEUE) for call in calls]
    write_submission_rows()
    KeyedTask.objects.filter(task_id__in=[r.id for r in results]).update(status="failed", error="boom")
    return [KeyedTask.objects.get(task_id=r.id) for r in results]


def test_a_retry_marks_its_failed_row_and_a_second_retry_names_the_first(gate_redis, broker):
    [row] = failed((7, "10.00"))
    new_id = recovery.retry(row.task_id, by="rita")
    row.refresh_from_db()
    assert (row.status, row.retried_as) == ("failed", new_id)
    with pytest.raises(ActionRefused, match=f"task {row.task_id} was retried already: it runs again as task {new_id}"):
        recovery.retry(row.task_id, by="sam")
    write_submission_rows()
    assert KeyedTask.objects.count() == 2, "one retry submitted"


def test_racing_retries_of_one_task_submit_it_once(gate_redis, broker):
    [row] = failed((7, "10.00"))
    outcomes: list[str] = []
    barrier = threading.Barrier(4)

    def retry() -> None:
        barrier.wait()
        try:
            outcomes.append(recovery.retry(row.task_id, by="a terminal"))
        except ActionRefused as refused:
            outcomes.append(str(refused))
        finally:
            connection.close()

    threads = [threading.Thread(target=retry) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    [new_id] = [o for o in outcomes if "retried already" not in o]
    assert sorted(outcomes) == sorted(
        [new_id] + [f"task {row.task_id} was retried already: it runs again as task {new_id}"] * 3
    )
    write_submission_rows()
    assert set(KeyedTask.objects.values_list("task_id", flat=True)) == {row.task_id, new_id}


def another_tasks_message(row: KeyedTask, **changes) -> str:
    """``row``'s stored message with ``changes`` (task id, name, or arguments) made."""
    message = TaskMessage.decode(row.message.encode(), ["json"])
    fields = {"task_name": message.task_name, "task_id": message.task_id, "args": message.args, **changes}
    forged = gate_message(fields["task_name"], fields["task_id"], fields["args"], message.kwargs, message.options)
    return forged.encode("json").decode()


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"task_id": "another-task"}, "is not its own: it is testproject.demo.tasks.charge[another-task]"),
        ({"task_name": step.name, "args": ("order:7", 1)}, "is not its own: it is testproject.demo.tasks.step["),
        ({"args": (8, "10.00")}, "is not its own: its arguments make key 'order:8', the task's is 'order:7'"),
    ],
)
def test_a_retry_and_a_rebuild_refuse_a_stored_message_that_is_not_the_tasks_own(changes, said, gate_redis, broker):
    [row] = failed((7, "10.00"))
    KeyedTask.objects.filter(pk=row.pk).update(message=another_tasks_message(row, **changes))
    with pytest.raises(ActionRefused, match=said.replace("[", r"\[")):
        recovery.retry(row.task_id)
    assert KeyedTask.objects.count() == 1 and broker.llen(QUEUE) == 1, "nothing submitted"

    KeyedTask.objects.filter(pk=row.pk).update(status="waiting")  # as if it waited when Redis lost everything
    broker.delete(QUEUE)
    gate_redis.flushdb()
    report = rebuild.rebuild()
    assert report.unrecoverable == [row.task_id] and not report.restored
    assert gate_redis.dbsize() == 0 and broker.llen(QUEUE) == 0
