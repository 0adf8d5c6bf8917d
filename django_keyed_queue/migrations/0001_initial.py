"""The app's tables, as the first release makes them.

Two indexes are PostgreSQL's alone and made by ``prefix_indexes``, not declared on the models: the
admin's search reads the start of a key or a task id as ``LIKE 'account:%'``, which a btree index
answers only under the C collation; databases are usually made with another (en_US.UTF-8), where it
needs ``varchar_pattern_ops``. On SQLite they would be second copies of indexes that serve the same
range already (``keyed_task_key_recent``, the unique constraint beginning with the task id). ``id`` is
in the key's so that the search reads a key prefix's ids from the index alone.
"""

from django.db import migrations, models

PREFIX_INDEXES = [
    models.Index(fields=["key", "id"], opclasses=["varchar_pattern_ops", "int8_ops"], name="keyed_task_key_prefix"),
    models.Index(fields=["task_id"], opclasses=["varchar_pattern_ops"], name="keyed_task_id_prefix"),
]


def prefix_indexes(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for index in PREFIX_INDEXES:
            schema_editor.add_index(apps.get_model("keyed_queue", "KeyedTask"), index)


def no_prefix_indexes(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for index in PREFIX_INDEXES:
            schema_editor.remove_index(apps.get_model("keyed_queue", "KeyedTask"), index)


class Migration(migrations.Migration):

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='IdempotencyKey',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('fingerprint', models.CharField(max_length=64, unique=True, verbose_name='fingerprint')),
                ('task_id', models.CharField(db_index=True, max_length=255, verbose_name='task id')),
                ('task_name', models.CharField(max_length=255, verbose_name='task name')),
                ('arguments', models.CharField(blank=True, default='', max_length=64, verbose_name='arguments digest')),
                ('created_at', models.DateTimeField(verbose_name='created at')),
                ('expires_at', models.DateTimeField(db_index=True, verbose_name='expires at')),
            ],
            options={
                'verbose_name': 'idempotency key',
                'verbose_name_plural': 'idempotency keys',
                'ordering': ['-id'],
            },
        ),
        migrations.CreateModel(
            name='KeyedTask',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('task_id', models.CharField(max_length=255, verbose_name='task id')),
                ('task_name', models.CharField(max_length=255, verbose_name='task name')),
                ('key', models.CharField(max_length=200, verbose_name='key')),
                ('ticket', models.BigIntegerField(blank=True, null=True, verbose_name='ticket')),
                ('status', models.CharField(choices=[('waiting', 'waiting'), ('dispatched', 'dispatched'), ('running', 'running'), ('retrying', 'retrying'), ('succeeded', 'succeeded'), ('failed', 'failed'), ('cancelled', 'cancelled'), ('ignored', 'ignored'), ('rejected', 'rejected'), ('superseded', 'superseded')], default='waiting', max_length=16, verbose_name='status')),
                ('arguments', models.TextField(blank=True, verbose_name='arguments')),
                ('message', models.TextField(blank=True, editable=False, verbose_name='message')),
                ('attempts', models.PositiveIntegerField(default=0, verbose_name='attempts')),
                ('worker', models.CharField(blank=True, max_length=255, verbose_name='worker')),
                ('enqueued_at', models.DateTimeField(verbose_name='enqueued at')),
                ('due_at', models.DateTimeField(blank=True, null=True, verbose_name='due at')),
                ('dispatched_at', models.DateTimeField(blank=True, null=True, verbose_name='dispatched at')),
                ('started_at', models.DateTimeField(blank=True, null=True, verbose_name='started at')),
                ('heartbeat_at', models.DateTimeField(blank=True, null=True, verbose_name='heartbeat at')),
                ('finished_at', models.DateTimeField(blank=True, null=True, verbose_name='finished at')),
                ('error', models.TextField(blank=True, verbose_name='error')),
                ('notes', models.TextField(blank=True, default='', verbose_name='notes')),
                ('retried_as', models.CharField(blank=True, default='', max_length=255, verbose_name='retried as')),
                ('retry_of', models.CharField(blank=True, default='', max_length=255, verbose_name='retry of')),
                ('superseded_by', models.CharField(blank=True, default='', max_length=255, verbose_name='superseded by')),
            ],
            options={
                'verbose_name': 'keyed task',
                'verbose_name_plural': 'keyed tasks',
                'ordering': ['-id'],
                'permissions': [('cancel_keyedtask', 'Can cancel a waiting keyed task'), ('retry_keyedtask', 'Can retry a failed keyed task'), ('release_keyedtask', 'Can release the stuck holder of a key'), ('pause_key', 'Can pause a key'), ('resume_key', 'Can resume a key'), ('change_key_limits', "Can set a key's limit and rate"), ('stop_keyedtask', 'Can stop a running keyed task'), ('run_now_keyedtask', 'Can start a delayed keyed task now')],
                'indexes': [models.Index(fields=['key', '-id'], name='keyed_task_key_recent'), models.Index(fields=['status', '-id'], name='keyed_task_status_recent'), models.Index(fields=['task_name', '-id'], name='keyed_task_name_recent'), models.Index(condition=models.Q(('status__in', ('waiting', 'dispatched', 'running', 'retrying'))), fields=['enqueued_at'], name='keyed_task_active')],
                'constraints': [models.UniqueConstraint(fields=('task_id', 'key', 'ticket'), name='keyed_task_one_row_per_submission')],
            },
        ),
        migrations.CreateModel(
            name='LiveKey',
            fields=[
            ],
            options={
                'verbose_name': 'live key',
                'verbose_name_plural': 'live keys',
                'proxy': True,
                'default_permissions': (),
                'indexes': [],
                'constraints': [],
            },
            bases=('keyed_queue.keyedtask',),
        ),
        migrations.CreateModel(
            name='KeyWord',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('word', models.CharField(max_length=200, verbose_name='word')),
                ('key', models.CharField(max_length=200, verbose_name='key')),
            ],
            options={
                'verbose_name': 'key word',
                'verbose_name_plural': 'key words',
                'default_permissions': (),
                'constraints': [models.UniqueConstraint(fields=('word', 'key'), name='keyed_key_word_unique')],
            },
        ),
        migrations.RunPython(prefix_indexes, no_prefix_indexes, elidable=False),
    ]
