"""The gate on a real Redis Cluster of 3 masters, in the user's project (its broker a redis-server of its own)."""

from __future__ import annotations

import pytest

from django_keyed_queue.gate.keys import CLUSTER_INDEX_SHARDS, DEADLINE_INDEX, Index, KeyNames, PoolNames
from testproject.history_checks import assert_serial
from tests.userproject.run_checks import accepted_by
from tests.userproject.test_pools import most_running
from tests.waiting import wait_until

from .workload import TIER_SETTINGS, Workload, check_strictly, run_workload

pytestmark = [pytest.mark.topologies, pytest.mark.workers]


def test_the_acceptance_workload_runs_on_a_cluster(make_project, cluster):
    cluster.flushall()
    project = make_project(KEYED_QUEUE_REDIS_URL=cluster.url, KEYED_QUEUE_REDIS_CLUSTER=True, **TIER_SETTINGS)
    workload = Workload()
    check_strictly(run_workload(project, workload))

    # The keys spread over every master, and so do the shards of the reaper's index.
    masters = {node.port for node in cluster.masters()}
    keys_on = {cluster.node_for_key(KeyNames(f"acct:{k}").meta).port for k in range(workload.keys)}
    assert keys_on == masters
    shards_on = {cluster.node_for_key(name).port for name in Index(DEADLINE_INDEX, CLUSTER_INDEX_SHARDS).names}
    assert shards_on == masters
    # The operator's view reads the cluster: nothing left active.
    assert project.manage("keyed_queue_status").stdout.splitlines() == ["active tasks: none", "redis: reachable"]


def test_a_project_given_one_node_without_the_setting_is_told_what_to_set(make_project, cluster):
    """The issue's new user: the URL of one node, no KEYED_QUEUE_REDIS_CLUSTER."""
    cluster.flushall()
    first = cluster.node_for_key("{x}")  # any master but the URL's, below
    key = next(f"acct:{k}" for k in range(100) if cluster.node_for_key(KeyNames(f"acct:{k}").meta).port != first.port)
    project = make_project(KEYED_QUEUE_REDIS_URL=f"redis://127.0.0.1:{first.port}", **TIER_SETTINGS)
    done = project.manage("shell", "-c", f"from shop import tasks; tasks.step.delay({key!r}, 0)", check=False)
    assert done.returncode != 0
    assert "set KEYED_QUEUE_REDIS_CLUSTER = True" in done.stderr, done.stderr
    assert project.rows() == {}, "nothing was written"


def test_a_pool_holds_its_limit_over_keys_on_every_master(make_project, cluster):
    """Pool "three" lives in a slot of its own, its tasks' keys in theirs, on other masters: a worker asks the
    pool, then the key, in two calls; the limit rests on neither call's order being kept by another."""
    cluster.flushall()
    project = make_project(KEYED_QUEUE_REDIS_URL=cluster.url, KEYED_QUEUE_REDIS_CLUSTER=True, **TIER_SETTINGS)
    project.start_workers("a", "b", concurrency=4)
    accepted = accepted_by(project.produce("pooled_step", 60, 30, 0, "0.05-0.15", prefix="pooled"))
    accepted += accepted_by(project.produce("plain_pooled_step", 20, 20, 0, "0.05-0.15", prefix="plain"))

    ids = {a["id"] for a in accepted}
    wait_until(lambda: ids <= {e["id"] for e in project.history() if e["event"] == "end"}, 90, 0.2, "every task")
    events = project.history()
    assert_serial(events)
    assert most_running(events, ids) == 3

    pool_on = cluster.node_for_key(PoolNames("three").running).port
    keys_on = {cluster.node_for_key(KeyNames(f"pooled:{k}").meta).port for k in range(30)}
    assert keys_on - {pool_on}, "keys on other masters than their pool's"
