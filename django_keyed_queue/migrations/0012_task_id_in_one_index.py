"""A task id is looked up by the unique constraint's index, which begins with it: its own index went.

Every row written updated one index fewer (two on PostgreSQL, where Django also kept a
``varchar_pattern_ops`` copy for LIKE). The admin's search reads a task id's prefix as
LIKE 'abcd%' on PostgreSQL, which only a ``varchar_pattern_ops`` index serves under most
collations: that one is made again here, PostgreSQL's alone (as ``0007``'s key prefix index).
"""

from django.db import migrations, models

TASK_ID_PREFIX_INDEX = models.Index(fields=["task_id"], opclasses=["varchar_pattern_ops"], name="keyed_task_id_prefix")


def add_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.add_index(apps.get_model("keyed_queue", "KeyedTask"), TASK_ID_PREFIX_INDEX)


def remove_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.remove_index(apps.get_model("keyed_queue", "KeyedTask"), TASK_ID_PREFIX_INDEX)


class Migration(migrations.Migration):
    dependencies = [
        ("keyed_queue", "0011_key_words"),
    ]

    operations = [
        migrations.AlterField(
            model_name="keyedtask",
            name="task_id",
            field=models.CharField(max_length=255, verbose_name="task id"),
        ),
        migrations.RunPython(add_index, remove_index, elidable=False),
    ]
