from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('chat', '0012_api_models_to_api_app'),
    ]

    operations = [
        migrations.AddField(
            model_name='adapterplatform',
            name='no_echo_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
