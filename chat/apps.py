from django.apps import AppConfig


class ChatConfig(AppConfig):
    name = "chat"
    verbose_name = "Chat"

    def ready(self) -> None:
        # The outbox listens to the send service's outbound_created signal (wake-ups); built-in
        # tools register themselves with the tool registry on import.
        import chat.outbox
        import chat.tools.memory
        import chat.tools.scheduling
        import chat.tools.timers  # noqa: F401
