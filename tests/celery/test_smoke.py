import pytest

from testproject.demo.tasks import step
from tests.helpers import check_history, read_history, wait_for_records

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.workers]


def test_one_key_runs_in_order(workers, gate_redis):
    results = [step.delay("k1", n, 0.05) for n in range(10)]
    wait_for_records([r.id for r in results])
    starts = check_history(read_history())
    assert starts["k1"] == list(range(10))
