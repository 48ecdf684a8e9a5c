# IdempotencyRecord and ApiRateWindow now belong to the api app (api 0001): only Django's state forgets
# them here; their tables and rows stay, owned by api.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('chat', '0011_claimed_by'),
        ('api', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name='IdempotencyRecord'),
                migrations.DeleteModel(name='ApiRateWindow'),
            ],
            database_operations=[],
        ),
    ]
