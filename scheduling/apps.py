from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "scheduling"
    verbose_name = "Scheduling"

    def ready(self) -> None:
        from chat.services import inbound_stored
        from scheduling.memory import on_inbound_stored, register_context_blocks

        # Inner state, memory slots, summary and scratch notes in the chat planner's prompt.
        register_context_blocks()
        # Long chats get their rolling summary refreshed from the cluster.
        inbound_stored.connect(on_inbound_stored, dispatch_uid="scheduling.memory.summary")
