# The API's models came from the chat app (chat 0001, 0002): only Django's state moves here, the tables
# keep their names (db_table) and their rows.

import django.db.models.deletion
from django.db import migrations, models


def _content_types_to(app_label, old_label, models_):
    """Point the moved models' content types (and so their permissions and admin log) at app_label."""

    def move(apps, schema_editor):
        ContentType = apps.get_model('contenttypes', 'ContentType')
        for model in models_:
            if not ContentType.objects.filter(app_label=app_label, model=model).exists():
                ContentType.objects.filter(app_label=old_label, model=model).update(app_label=app_label)

    return move


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('chat', '0011_claimed_by'),
        ('contenttypes', '0002_remove_content_type_name'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='IdempotencyRecord',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('key', models.CharField(max_length=255)),
                        ('request_hash', models.CharField(max_length=64)),
                        ('status_code', models.PositiveSmallIntegerField(blank=True, null=True)),
                        ('response', models.JSONField(blank=True, null=True)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('token', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, to='chat.apitoken')),
                    ],
                    options={
                        'db_table': 'chat_idempotencyrecord',
                        'constraints': [models.UniqueConstraint(fields=('token', 'key'), name='idempotency_unique_key')],
                    },
                ),
                migrations.CreateModel(
                    name='ApiRateWindow',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('window_start', models.DateTimeField()),
                        ('count', models.PositiveIntegerField(default=0)),
                        ('token', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='chat.apitoken')),
                    ],
                    options={
                        'db_table': 'chat_apiratewindow',
                        'constraints': [models.UniqueConstraint(fields=('token', 'window_start'), name='api_rate_window_unique')],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(
            _content_types_to('api', 'chat', ('idempotencyrecord', 'apiratewindow')),
            _content_types_to('chat', 'api', ('idempotencyrecord', 'apiratewindow')),
        ),
    ]
