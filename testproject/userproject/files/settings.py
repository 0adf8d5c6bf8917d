# The tier's pools, which its tasks name (shop/tasks.py): a limit shared by every key and worker, and a rate.
KEYED_QUEUE_POOLS = {"three": {"limit": 3}, "five_a_second": {"rate": "5/s"}}
# The benchmark's (bench/userproject.py): a pool it never fills, so its rounds measure what asking one costs.
KEYED_QUEUE_POOLS["roomy"] = {"limit": 1000}
