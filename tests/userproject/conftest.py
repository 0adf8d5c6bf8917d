"""The user's project tier: a project made as a user makes one, its own redis-server for broker and gate.

Its fixtures (``workdir``, ``user_redis``, ``project_template``, ``make_project``) are in the root
conftest: the topologies tier builds the same project.
"""
