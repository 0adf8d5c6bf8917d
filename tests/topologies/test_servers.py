"""The local Redis Cluster and Sentinel set-ups themselves (testproject/topologies.py), on real servers.

Run with ``pytest -m topologies tests/topologies``; the default run leaves them out.
"""

from __future__ import annotations

import time

import pytest
import redis
from redis.cluster import RedisCluster
from redis.sentinel import Sentinel

from testproject.servers import RedisServer
from testproject.topologies import LocalCluster, LocalSentinel
from tests.waiting import wait_until

pytestmark = pytest.mark.topologies

KEYS = [f"key-{i}" for i in range(1000)]


def dbsize(node: RedisServer) -> int:
    with redis.Redis.from_url(node.url) as client:
        return client.dbsize()


def has_script(node: RedisServer, sha: str) -> bool:
    with redis.Redis.from_url(node.url) as client:
        return client.script_exists(sha)[0]


def test_the_cluster_spreads_keys_over_its_masters_and_a_restarted_node_comes_back_empty(tmp_path):
    with LocalCluster(tmp_path / "cluster") as cluster, RedisCluster.from_url(cluster.url) as client:
        masters = cluster.masters()
        assert len(masters) == 3 and cluster.url == f"redis://127.0.0.1:{masters[0].port}"
        for key in KEYS:
            client.set(key, key)
        sizes = {master.port: dbsize(master) for master in masters}
        assert all(sizes.values()) and sum(sizes.values()) == len(KEYS), sizes
        victim = cluster.node_for_key(KEYS[0])
        with redis.Redis.from_url(victim.url, decode_responses=True) as direct:
            lost = sorted(direct.keys())
        assert KEYS[0] in lost and all(cluster.node_for_key(key) is victim for key in lost[:10])
        sha = client.script_load("return 1")  # on every master

        cluster.restart(victim)  # SIGKILL, then back on its port with its nodes.conf and no data

        assert cluster.masters() == masters  # back as the master of its slots
        for node in cluster.nodes:
            with redis.Redis.from_url(node.url, decode_responses=True) as direct:
                assert direct.cluster("INFO")["cluster_state"] == "ok"
        assert dbsize(victim) == 0 and not has_script(victim, sha)
        assert {master.port: dbsize(master) for master in masters if master is not victim} == {
            port: size for port, size in sizes.items() if port != victim.port
        }
        # The client that knew the killed node's connection still serves every slot.
        assert client.get(lost[0]) is None
        kept = next(key for key in KEYS if key not in lost)
        assert client.get(kept) == kept.encode()
        client.set(lost[0], "again")
        assert client.get(lost[0]) == b"again"

        assert all(has_script(master, sha) for master in masters if master is not victim)

        cluster.flushall()
        assert sum(dbsize(master) for master in masters) == 0
        assert not any(has_script(node, sha) for node in cluster.nodes)


def test_the_sentinels_fail_over_when_the_master_is_killed(tmp_path):
    with LocalSentinel(tmp_path / "sentinel") as setup:
        assert setup.url == ";".join(f"sentinel://127.0.0.1:{port}" for port in setup.sentinel_ports)
        old, replica = setup.master(), setup.replica()
        assert old is not replica
        with redis.Redis.from_url(old.url) as direct:
            direct.set("before", "1")
            assert direct.wait(1, 5000) == 1  # on the replica too: it survives the failover

        assert setup.kill_master() is old
        killed_at = time.monotonic()
        new = setup.wait_for_failover(old, timeout=30)
        print(f"failover in {time.monotonic() - killed_at:.1f} s")

        assert new is replica and setup.master() is new
        sentinel = Sentinel([("127.0.0.1", port) for port in setup.sentinel_ports], socket_timeout=2)
        try:
            with sentinel.master_for(setup.master_name, socket_timeout=2) as client:
                assert client.get("before") == b"1"
                client.set("after", "2")
                assert client.connection_pool.get_master_address() == ("127.0.0.1", new.port)
        finally:
            sentinel.close()
        with redis.Redis.from_url(new.url) as direct:
            assert direct.get("after") == b"2"

        setup.restart(old)  # the set heals: the old master comes back as the new one's replica
        assert setup.master() is new and setup.replica() is old
        with redis.Redis.from_url(old.url) as direct:
            wait_until(lambda: direct.get("after") == b"2", timeout=10, message="the old master to replicate")
