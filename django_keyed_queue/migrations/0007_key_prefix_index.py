"""The admin's search reads the start of a key as LIKE 'account:%' on PostgreSQL.

A btree index answers such a LIKE only under the C collation; databases are usually made with
another (en_US.UTF-8), where it needs ``varchar_pattern_ops``. The index is PostgreSQL's alone, so
it is made here and not declared on the model: on SQLite it would be a second copy of
``keyed_task_key_recent``, which already serves its range (``key >= 'account:' AND key < 'account;'``).
``id`` is in it so that the search reads a key prefix's ids from the index alone.
"""

from django.db import migrations, models

KEY_PREFIX_INDEX = models.Index(
    fields=["key", "id"], opclasses=["varchar_pattern_ops", "int8_ops"], name="keyed_task_key_prefix"
)


def add_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.add_index(apps.get_model("keyed_queue", "KeyedTask"), KEY_PREFIX_INDEX)


def remove_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.remove_index(apps.get_model("keyed_queue", "KeyedTask"), KEY_PREFIX_INDEX)


class Migration(migrations.Migration):
    dependencies = [
        ("keyed_queue", "0006_task_retried_as"),
    ]

    operations = [
        migrations.RunPython(add_index, remove_index, elidable=False),
    ]
