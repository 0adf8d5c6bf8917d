"""The records: what happened to every keyed submission, in the project's database.

Redis decides; these record. ``models`` holds the tables, ``manager`` every
write to them (through the project's database routers), ``recorder`` the
buffer of a process's transitions, ``idempotency`` the keys that stop
duplicate submissions, ``key_words`` the keys' words the admin's search reads.
Nothing here publishes, runs or decides anything.
"""
