"""A group session's identity is the group: clear the speaker earlier versions stored on it."""

from django.db import migrations


def clear_group_users(apps, schema_editor):
    ChatSession = apps.get_model("chat", "ChatSession")
    ChatSession.objects.filter(chat_type="group").update(user_id="", user_nickname="", user_cardname="")


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0006_delivery_confirmation"),
    ]

    operations = [
        migrations.RunPython(clear_group_users, migrations.RunPython.noop),
    ]
