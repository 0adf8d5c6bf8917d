"""The gate's Redis settings for a Cluster, Sentinel and replica acknowledgement, and the checks that refuse them."""

import pytest
import redis
from django.test import override_settings
from redis.sentinel import SentinelConnectionPool

from django_keyed_queue.checks import check_settings
from django_keyed_queue.gate.clients import connect


def _ids(**settings) -> list[str]:
    with override_settings(**{**ONE_SERVER, **settings}):
        return sorted(p.id for p in check_settings())


def _messages(**settings) -> str:
    with override_settings(**{**ONE_SERVER, **settings}):
        return "\n".join(p.msg for p in check_settings())


#: What each test changes is checked against a gate on one server (the tier may run on a cluster).
ONE_SERVER = {"KEYED_QUEUE_REDIS_URL": "redis://localhost:6379/0", "KEYED_QUEUE_REDIS_CLUSTER": False}


def test_a_cluster_on_database_zero_checks_clean():
    for url in ("redis://node-1:7000", "redis://node-1:7000/0", "redis://node-1:7000/"):
        assert _ids(KEYED_QUEUE_REDIS_CLUSTER=True, KEYED_QUEUE_REDIS_URL=url) == [], url


def test_a_cluster_refuses_another_database():
    assert _ids(KEYED_QUEUE_REDIS_CLUSTER=True, KEYED_QUEUE_REDIS_URL="redis://node-1:7000/2") == ["keyed_queue.E008"]
    assert "names database '2'" in _messages(KEYED_QUEUE_REDIS_CLUSTER=True, KEYED_QUEUE_REDIS_URL="redis://n:7000/2")


def test_cluster_must_be_a_boolean_and_no_sentinel():
    assert _ids(KEYED_QUEUE_REDIS_CLUSTER="yes") == ["keyed_queue.E008"]
    both = {"KEYED_QUEUE_REDIS_URL": "sentinel://s1:26379", "KEYED_QUEUE_REDIS_SENTINEL_MASTER": "mymaster"}
    assert _ids(KEYED_QUEUE_REDIS_CLUSTER=True, **both) == ["keyed_queue.E008"]


def test_a_sentinel_url_needs_its_master_name():
    url = "sentinel://s1:26379;sentinel://s2:26379"
    assert _ids(KEYED_QUEUE_REDIS_URL=url) == ["keyed_queue.E007"]
    assert "KEYED_QUEUE_REDIS_SENTINEL_MASTER names no master" in _messages(KEYED_QUEUE_REDIS_URL=url)
    assert _ids(KEYED_QUEUE_REDIS_URL=url, KEYED_QUEUE_REDIS_SENTINEL_MASTER="mymaster") == []


def test_a_master_name_without_sentinels_is_refused():
    assert _ids(KEYED_QUEUE_REDIS_SENTINEL_MASTER="mymaster") == ["keyed_queue.E007"]


@pytest.mark.parametrize("bad", [-1, 1.5, "1", True, None])
def test_wait_replicas_is_a_whole_number(bad):
    assert _ids(KEYED_QUEUE_REDIS_WAIT_REPLICAS=bad) == ["keyed_queue.E009"]


def test_wait_timeout_is_positive():
    assert _ids(KEYED_QUEUE_REDIS_WAIT_REPLICAS=1, KEYED_QUEUE_REDIS_WAIT_TIMEOUT_SECONDS=0) == ["keyed_queue.E009"]
    assert _ids(KEYED_QUEUE_REDIS_WAIT_REPLICAS=1, KEYED_QUEUE_REDIS_WAIT_TIMEOUT_SECONDS=0.5) == []


def test_a_url_no_client_can_use_is_told_with_every_other_problem_of_the_gate_s_redis():
    """One run of the checks names all that is wrong: a fix of the URL does not reveal the next error."""
    ids = _ids(KEYED_QUEUE_REDIS_URL="http://gate:6379", KEYED_QUEUE_REDIS_WAIT_REPLICAS=-1)
    assert ids == ["keyed_queue.E001", "keyed_queue.E009"]


def test_a_sentinel_url_reads_as_celerys_does():
    client = connect(
        "sentinel://:secret@s1:26379/3;sentinel://s2:26380;sentinel://s3", sentinel_master="mymaster", socket_timeout=4
    )
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "mymaster"
    assert [(c.connection_pool.connection_kwargs["host"], c.connection_pool.connection_kwargs["port"])
            for c in pool.sentinel_manager.sentinels] == [("s1", 26379), ("s2", 26380), ("s3", 26379)]  # fmt: skip
    assert pool.connection_kwargs["password"] == "secret" and pool.connection_kwargs["db"] == 3
    sentinel_options = pool.sentinel_manager.sentinels[0].connection_pool.connection_kwargs
    assert sentinel_options["socket_timeout"] == 4 and sentinel_options["password"] is None


def test_connect_refuses_what_cannot_work():
    with pytest.raises(ValueError, match="needs the name of its master"):
        connect("sentinel://s1:26379")
    with pytest.raises(ValueError, match="names no Redis Cluster"):
        connect("sentinel://s1:26379", sentinel_master="m", cluster=True)
    with pytest.raises(ValueError, match="database must be a number"):
        connect("sentinel://s1:26379/x", sentinel_master="m")
    assert type(connect("redis://localhost:1/2")) is redis.Redis
