"""The gate on a real Redis Cluster when it moves under it: scripts lost, slots moved (MOVED) or moving (ASK)."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from redis.crc import key_slot

from django_keyed_queue.gate import Finish, Gate, NotSent, ReplicasBehind, Start, Submission
from django_keyed_queue.gate.clients import close, connect
from django_keyed_queue.gate.keys import KeyNames
from testproject.topologies import LocalCluster
from tests.redis_connections import disconnect_clients

pytestmark = pytest.mark.topologies


@pytest.fixture
def gate(cluster):
    cluster.flushall()
    client = connect(cluster.url, cluster=True)
    yield Gate(client, lease_seconds=30, dispatch_timeout_seconds=60)
    close(client)  # a cluster client's node pools too


def _node(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, decode_responses=True)


class Migration:
    """The slot of ``key`` moved by hand from its master to another, as ``redis-cli --cluster reshard`` does."""

    def __init__(self, cluster, key: str) -> None:
        self.cluster = cluster
        self.slot = key_slot(KeyNames(key).base.encode())
        self.source = cluster.node_for_key(KeyNames(key).meta)
        self.target = next(node for node in cluster.masters() if node.port != self.source.port)
        with _node(self.source.port) as source, _node(self.target.port) as target:
            self.source_id, self.target_id = source.cluster("myid"), target.cluster("myid")

    def begin(self) -> None:
        with _node(self.target.port) as target:
            target.execute_command("CLUSTER", "SETSLOT", self.slot, "IMPORTING", self.source_id)
        with _node(self.source.port) as source:
            source.execute_command("CLUSTER", "SETSLOT", self.slot, "MIGRATING", self.target_id)

    def move_keys(self) -> int:
        with _node(self.source.port) as source:
            keys = source.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, 1000)
            if keys:
                source.execute_command("MIGRATE", "127.0.0.1", self.target.port, "", 0, 5000, "KEYS", *keys)
        return len(keys)

    def end(self) -> None:
        for node in self.cluster.masters():
            with _node(node.port) as client:
                client.execute_command("CLUSTER", "SETSLOT", self.slot, "NODE", self.target_id)


def test_keys_and_index_shards_spread_over_every_master(gate, cluster):
    keys = [f"acct:{i}" for i in range(60)]
    gate.submit_many([Submission(key, b"m", f"t-{key}", record=b"r") for key in keys])
    masters = {node.port for node in cluster.masters()}
    assert {cluster.node_for_key(KeyNames(key).meta).port for key in keys} == masters
    used = {gate.deadlines.shard_of(key) for key in keys}
    assert {cluster.node_for_key(shard).port for shard in used} == masters
    assert {u.key for u in gate.unwritten(keys).records} == set(keys)


def test_scripts_lost_by_some_masters_are_loaded_and_each_refused_call_is_sent_once_more(gate, cluster):
    keys = [f"acct:{i}" for i in range(30)]
    gate.submit_many([Submission(key, b"m1", f"a-{key}") for key in keys])  # every master has the script
    lost_on = cluster.node_for_key(KeyNames(keys[0]).meta)
    with _node(lost_on.port) as node:
        node.script_flush()  # as after a restart: this master refuses EVALSHA, the others run it

    results = gate.submit_many([Submission(key, b"m2", f"b-{key}") for key in keys])
    assert [r.ticket for r in results] == [2] * len(keys), "each key took one ticket: none was submitted twice"
    assert all(gate.inspect(key).last_ticket == 2 for key in keys)


def test_a_slot_moved_to_another_master_is_followed(gate, cluster):
    first = gate.submit(Submission("moving", b"m1"))  # the client learns where the key's slot is
    migration = Migration(cluster, "moving")
    migration.begin()
    assert migration.move_keys() >= 3  # meta, queue, messages, holders...
    migration.end()

    second = gate.submit(Submission("moving", b"m2"))  # sent to the old master, which answers MOVED
    assert (first.ticket, second.ticket, second.granted) == (1, 2, False)
    assert cluster.node_for_key(KeyNames("moving").meta).port == migration.target.port
    finished = gate.finish(Finish("moving", first.ticket, gate.start(Start("moving", 1, 1)).token))
    assert [g.ticket for g in finished.granted] == [2], "the key's state moved whole"


def test_a_call_on_a_slot_in_mid_migration_waits_for_the_move_to_end(gate, cluster):
    gate.submit(Submission("asked", b"m1"))
    migration = Migration(cluster, "asked")
    migration.begin()
    migration.move_keys()
    # The old master still owns the slot but no longer has the keys: it answers ASK. The new master,
    # importing the slot, refuses a script over keys it does not all have yet (TRYAGAIN) until the
    # move ends; the call is sent again meanwhile.
    ending = threading.Timer(0.5, migration.end)
    ending.start()
    try:
        started = time.monotonic()
        assert gate.submit(Submission("asked", b"m2")).ticket == 2
        assert time.monotonic() - started >= 0.4, "the call waited for the move"
    finally:
        ending.join()
    with _node(migration.target.port) as target:
        assert target.hget(KeyNames("asked").messages, "2") == "m2"
    assert gate.inspect("asked").last_ticket == 2


def test_a_call_on_a_slot_whose_move_does_not_end_is_reported_as_not_sent(gate, cluster):
    gate.submit(Submission("stuck", b"m1"))
    migration = Migration(cluster, "stuck")
    migration.begin()
    migration.move_keys()
    try:
        with pytest.raises(NotSent, match="kept refusing 1 of"):
            gate.submit(Submission("stuck", b"m2"))
    finally:
        migration.end()
    assert gate.inspect("stuck").last_ticket == 1, "nothing was taken"


def test_each_master_s_replica_acknowledges_a_transition_when_asked(tmp_path):
    with LocalCluster(tmp_path / "replicated", replicas=1) as replicated:
        client = connect(replicated.url, cluster=True)
        try:
            keys = [f"acct:{i}" for i in range(30)]  # on every master
            acknowledged = Gate(client, wait_replicas=1, wait_timeout_seconds=2)
            assert [r.ticket for r in acknowledged.submit_many([Submission(k, b"m", f"t-{k}") for k in keys])] == [
                1
            ] * 30
            with pytest.raises(ReplicasBehind, match="1 of the 2 replicas required"):
                Gate(client, wait_replicas=2, wait_timeout_seconds=0.2).submit(Submission("acct:0", b"m2"))
        finally:
            close(client)  # a cluster client's node pools too
            disconnect_clients({node.port for node in replicated.nodes})
