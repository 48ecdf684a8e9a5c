from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class SchedulingConfig(AppConfig):
    name = "scheduling"
    verbose_name = _("Scheduling")

    def ready(self) -> None:
        # Tools offered to the chat planner (scope chat): scheduled messages, timers, memory and notes;
        # and the life loop's own (scope life): send_message, update_inner_state, do_nothing.
        import scheduling.life.loop_tools
        import scheduling.life.memory_tools
        import scheduling.life.tools
        import scheduling.tools  # noqa: F401
        from chat.services import inbound_stored
        from scheduling.life.memory import on_inbound_stored, register_context_blocks
        from scheduling.offline import register_commands

        # Reminders the offline planner understands without a model (/schedule, "remind me in 10 minutes…").
        register_commands()
        # Inner state, memory slots, summary and scratch notes in the chat planner's prompt.
        register_context_blocks()
        # Long chats get their rolling summary refreshed from the cluster.
        inbound_stored.connect(on_inbound_stored, dispatch_uid="scheduling.memory.summary")
