"""A Django project made the way a user makes one (project.py), from the README and files/; the user's
project tier (tests/userproject), the topologies tier and the benches bench.userproject and bench.redis_restart
build it."""
