import pytest
import redis
from django.conf import settings

#: Submissions in this tier go to a queue no worker consumes, so the test can inspect the broker.
QUEUE = "keyed-queue-tests-unconsumed"


@pytest.fixture
def broker(redis_server):
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.delete(QUEUE)
    yield client
    client.delete(QUEUE)
    client.close()
