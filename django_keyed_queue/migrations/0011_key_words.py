"""The later words of keys, which the admin's search reads (``records.key_words``), for the keys
that already have records: read in key order from the key index, ``CHUNK`` keys at a time."""

import re

from django.db import migrations, models

#: The separators as ``records.key_words.KEY_SEPARATORS`` had them when this was written.
SEPARATOR = re.compile(r"[ :/\-_.|#,;=+@]")
CHUNK = 10_000


def words_of_the_keys_there(apps, schema_editor):
    alias = schema_editor.connection.alias
    KeyWord = apps.get_model("keyed_queue", "KeyWord")
    keys = apps.get_model("keyed_queue", "KeyedTask").objects.using(alias).order_by("key")
    keys = keys.values_list("key", flat=True).distinct()
    last = None
    while chunk := list((keys if last is None else keys.filter(key__gt=last))[:CHUNK]):
        last = chunk[-1]
        words = sorted({(word, key) for key in chunk for word in SEPARATOR.split(key)[1:] if word})
        rows = [KeyWord(word=word, key=key) for word, key in words]
        KeyWord.objects.using(alias).bulk_create(rows, batch_size=1000, ignore_conflicts=True)


class Migration(migrations.Migration):

    dependencies = [
        ('keyed_queue', '0010_stop_run_now_and_notes'),
    ]

    operations = [
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
        migrations.RunPython(words_of_the_keys_there, migrations.RunPython.noop, elidable=False),
    ]
