from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ChatConfig(AppConfig):
    name = "chat"
    verbose_name = _("Chat")

    def ready(self) -> None:
        # The notifier listens to the send service's outbound_created signal (wake-ups); chat.runtime
        # connects the session runtimes (Channels consumers) to `inbound_stored` (sent by the gateway
        # in the ASGI process); the planner's own actions (reply, no_reply, send_emoji) register as tools;
        # chat.send_hooks runs the before_send handlers of the rows the send service holds (outbound_held).
        # Apps above chat register their components from their own ready().
        import chat.actions
        import chat.notify
        import chat.runtime
        import chat.send_hooks  # noqa: F401
