"""Delivery confirmed by the platform: `delivered_at` (the hand-over time until now) becomes `sent_at`;
a new `delivered_at` records the adapter's echo; states `delivered` and `unconfirmed`; the redelivery
backoff; what we know of each platform's adapter (AdapterPlatform)."""

from django.db import migrations, models
from django.db.models import F, Q


def confirmed_rows_are_delivered(apps, schema_editor):
    # A sent row whose echo already came (it carries the platform's id) was delivered.
    Message = apps.get_model("chat", "Message")
    Message.objects.filter(direction="out", delivery_status="sent").exclude(platform_message_id="").update(
        delivery_status="delivered", delivered_at=F("sent_at")
    )


def delivered_rows_are_sent(apps, schema_editor):
    Message = apps.get_model("chat", "Message")
    Message.objects.filter(delivery_status__in=["delivered", "unconfirmed"]).update(delivery_status="sent")


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0005_readable_json"),
    ]

    operations = [
        migrations.RemoveConstraint(model_name="message", name="message_sent_has_time"),
        migrations.RenameField(model_name="message", old_name="delivered_at", new_name="sent_at"),
        migrations.AddField(
            model_name="message", name="delivered_at", field=models.DateTimeField(blank=True, null=True)
        ),
        migrations.AddField(
            model_name="message", name="next_attempt_at", field=models.DateTimeField(blank=True, null=True)
        ),
        migrations.AlterField(
            model_name="message",
            name="delivery_status",
            field=models.CharField(
                blank=True,
                choices=[
                    ("pending", "Pending"),
                    ("sending", "Sending"),
                    ("sent", "Sent"),
                    ("delivered", "Delivered"),
                    ("unconfirmed", "Unconfirmed"),
                    ("failed", "Failed"),
                ],
                max_length=12,
            ),
        ),
        migrations.RunPython(confirmed_rows_are_delivered, delivered_rows_are_sent),
        migrations.AddConstraint(
            model_name="message",
            constraint=models.CheckConstraint(
                condition=~Q(delivery_status__in=["sent", "unconfirmed"]) | Q(sent_at__isnull=False),
                name="message_sent_has_time",
            ),
        ),
        migrations.AddConstraint(
            model_name="message",
            constraint=models.CheckConstraint(
                condition=~Q(delivery_status="delivered") | Q(delivered_at__isnull=False),
                name="message_delivered_has_time",
            ),
        ),
        migrations.CreateModel(
            name="AdapterPlatform",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("platform", models.CharField(max_length=64, unique=True)),
                ("first_echo_at", models.DateTimeField(blank=True, null=True)),
                ("last_echo_at", models.DateTimeField(blank=True, null=True)),
                ("accept_format", models.JSONField(blank=True, default=list)),
                ("bot_account", models.CharField(blank=True, max_length=128)),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
            options={"ordering": ["platform"]},
        ),
    ]
