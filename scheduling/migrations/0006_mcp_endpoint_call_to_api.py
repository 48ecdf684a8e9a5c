# McpEndpointCall now belongs to the api app (api 0002): only Django's state forgets it here; its table
# and rows stay, owned by api.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('scheduling', '0005_claimed_by'),
        ('api', '0002_mcp_endpoint_call'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name='McpEndpointCall'),
            ],
            database_operations=[],
        ),
    ]
