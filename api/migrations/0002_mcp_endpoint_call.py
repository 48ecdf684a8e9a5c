# The MCP endpoint's call log came from the scheduling app (scheduling 0004): only Django's state moves
# here, the table keeps its name (db_table) and its rows.

import django.db.models.deletion
import django.utils.timezone
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

    dependencies = [
        ('api', '0001_initial'),
        ('chat', '0011_claimed_by'),
        ('scheduling', '0005_claimed_by'),
        ('contenttypes', '0002_remove_content_type_name'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='McpEndpointCall',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('tool', models.CharField(max_length=128)),
                        ('ok', models.BooleanField()),
                        ('error_code', models.CharField(blank=True, max_length=64)),
                        ('duration_ms', models.FloatField()),
                        ('created_at', models.DateTimeField(db_index=True, default=django.utils.timezone.now)),
                        ('token', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, to='chat.apitoken')),
                    ],
                    options={
                        'verbose_name': 'MCP endpoint call',
                        'db_table': 'scheduling_mcpendpointcall',
                        'ordering': ['-created_at', '-id'],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(
            _content_types_to('api', 'scheduling', ('mcpendpointcall',)),
            _content_types_to('scheduling', 'api', ('mcpendpointcall',)),
        ),
    ]
