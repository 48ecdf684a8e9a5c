import django.utils.timezone
from django.db import migrations, models


def forget_heartbeats(apps, schema_editor):
    # Heartbeats are rewritten every few seconds by the processes running the new code; the old rows
    # carry no instance and no expiry.
    apps.get_model("maibot", "ProcessHeartbeat").objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [
        ("maibot", "0004_mcp_servers_permission"),
    ]

    operations = [
        migrations.RunPython(forget_heartbeats, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="processheartbeat",
            name="name",
            field=models.CharField(max_length=128),
        ),
        migrations.AddField(
            model_name="processheartbeat",
            name="instance",
            field=models.CharField(default="", max_length=32, unique=True),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="processheartbeat",
            name="alive_until",
            field=models.DateTimeField(db_index=True, default=django.utils.timezone.now),
            preserve_default=False,
        ),
    ]
