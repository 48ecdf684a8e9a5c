from django.db import migrations, models


class Migration(migrations.Migration):
    """Heartbeats name their process's instance and say until when it counts as alive. Both nullable, and
    `name` no longer unique, so that processes of the previous version, still running during a rolling
    upgrade, go on writing theirs."""

    dependencies = [
        ("maibot", "0004_mcp_servers_permission"),
    ]

    operations = [
        migrations.AlterField(
            model_name="processheartbeat",
            name="name",
            field=models.CharField(max_length=128),
        ),
        migrations.AddField(
            model_name="processheartbeat",
            name="instance",
            field=models.CharField(max_length=32, null=True, unique=True),
        ),
        migrations.AddField(
            model_name="processheartbeat",
            name="alive_until",
            field=models.DateTimeField(db_index=True, null=True),
        ),
    ]
