"""What an operator sees: an idempotency key's text and the duplicates it answered, and a task's first start
(the end of its wait for its key, whatever its later attempts)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('keyed_queue', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='idempotencykey',
            name='duplicates',
            field=models.PositiveIntegerField(default=0, verbose_name='duplicates answered'),
        ),
        migrations.AddField(
            model_name='idempotencykey',
            name='key',
            field=models.CharField(blank=True, db_index=True, default='', max_length=255, verbose_name='idempotency key'),
        ),
        migrations.AddField(
            model_name='idempotencykey',
            name='last_duplicate_at',
            field=models.DateTimeField(blank=True, null=True, verbose_name='last duplicate at'),
        ),
        migrations.AddField(
            model_name='keyedtask',
            name='first_started_at',
            field=models.DateTimeField(blank=True, null=True, verbose_name='first started at'),
        ),
    ]
