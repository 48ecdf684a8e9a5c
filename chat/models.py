"""Chat sessions, their messages (inbound and the outbound outbox), media, and the planner's records."""

from __future__ import annotations

import hashlib
import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext, gettext_noop
from django.utils.translation import gettext_lazy as _


class ChatType(models.TextChoices):
    PRIVATE = "private", _("Private")
    GROUP = "group", _("Group")


def make_session_id(platform: str, chat_type: str, target_id: str) -> str:
    """Stable, globally unique id of a conversation: platform + chat type + user or group id."""
    return hashlib.sha1(f"{platform}|{chat_type}|{target_id}".encode()).hexdigest()[:24]


class ChatSession(models.Model):
    session_id = models.CharField(max_length=32, unique=True, editable=False, verbose_name=_("session id"))
    platform = models.CharField(max_length=64, verbose_name=_("platform"))
    chat_type = models.CharField(max_length=16, choices=ChatType.choices, verbose_name=_("chat type"))
    # Private chat: the person. Group chat: empty (the group is the target; speakers are on messages).
    user_id = models.CharField(max_length=128, blank=True, verbose_name=_("user id"))
    user_nickname = models.CharField(max_length=255, blank=True, verbose_name=_("user nickname"))
    user_cardname = models.CharField(max_length=255, blank=True, verbose_name=_("user cardname"))
    group_id = models.CharField(max_length=128, blank=True, verbose_name=_("group id"))
    group_name = models.CharField(max_length=255, blank=True, verbose_name=_("group name"))
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))
    last_active_at = models.DateTimeField(auto_now_add=True, db_index=True, verbose_name=_("last active at"))

    class Meta:
        verbose_name = _("chat session")
        verbose_name_plural = _("chat sessions")
        ordering = ["-last_active_at"]
        constraints = [
            models.CheckConstraint(
                name="session_target_present",
                condition=(Q(chat_type="private") & ~Q(user_id="")) | (Q(chat_type="group") & ~Q(group_id="")),
            ),
        ]
        indexes = [models.Index(fields=["platform", "chat_type", "user_id"])]

    def __str__(self) -> str:
        # In the operator's language on a console page ("qq 私聊 小红"); English elsewhere (logs).
        if self.chat_type == ChatType.GROUP:
            return gettext("%(platform)s group %(name)s") % {
                "platform": self.platform,
                "name": self.group_name or self.group_id,
            }
        return gettext("%(platform)s private %(name)s") % {
            "platform": self.platform,
            "name": self.user_nickname or self.user_id,
        }

    @property
    def is_private(self) -> bool:
        return self.chat_type == ChatType.PRIVATE

    @property
    def target_id(self) -> str:
        return self.user_id if self.is_private else self.group_id


class Direction(models.TextChoices):
    IN = "in", _("Inbound")
    OUT = "out", _("Outbound")


class SourceKind(models.TextChoices):
    USER = "user", _("User")
    REPLY = "reply", _("Planner reply")
    SCHEDULED_SEND = "scheduled_send", _("Scheduled send")
    PROACTIVE = "proactive", _("Proactive (API)")
    TIMER = "timer", _("Timer / life loop")
    ADMIN = "admin", _("Operator")


class DeliveryStatus(models.TextChoices):
    """An outbound message's fate. pending → sending → sent (handed to the adapter) → delivered (the
    platform's id came back in the adapter's `message_id_echo`) or unconfirmed (no echo after
    gateway.max_delivery_attempts hand-overs); failed when it could not be handed over at all."""

    PENDING = "pending", _("Pending")
    SENDING = "sending", _("Sending")
    SENT = "sent", _("Sent")
    DELIVERED = "delivered", _("Delivered")
    UNCONFIRMED = "unconfirmed", _("Unconfirmed")
    FAILED = "failed", _("Failed")


# The states a message no longer leaves by itself (an operator may still resend it).
FINAL_DELIVERY_STATES = (DeliveryStatus.DELIVERED, DeliveryStatus.UNCONFIRMED, DeliveryStatus.FAILED)


class ReadableJSONField(models.JSONField):
    """A JSONField that always reads back. A document too deep for the json module (stored before
    ingest bounded nesting) reads as `placeholder`, so no page that shows it fails."""

    def __init__(self, *args, placeholder=None, **kwargs) -> None:
        self.placeholder = placeholder
        super().__init__(*args, **kwargs)

    def from_db_value(self, value, expression, connection):
        try:
            return super().from_db_value(value, expression, connection)
        except RecursionError:
            return self.placeholder


UNREADABLE_SEGMENTS = [{"type": "text", "data": "[stored content nested too deeply to show]"}]


class Message(models.Model):
    """One chat message. Outbound rows double as the outbox the ASGI side delivers from."""

    # Our own id, sent to the adapter as message_info.message_id and echoed back in receipts.
    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False, verbose_name=_("uid"))
    session = models.ForeignKey(
        ChatSession, on_delete=models.CASCADE, related_name="messages", verbose_name=_("session")
    )
    direction = models.CharField(max_length=3, choices=Direction.choices, verbose_name=_("direction"))
    source_kind = models.CharField(max_length=16, choices=SourceKind.choices, verbose_name=_("source kind"))
    # The platform's id: from the inbound envelope, or from the adapter's echo receipt for outbound.
    platform_message_id = models.CharField(max_length=128, blank=True, verbose_name=_("platform message id"))
    sender_id = models.CharField(max_length=128, blank=True, verbose_name=_("sender id"))
    sender_nickname = models.CharField(max_length=255, blank=True, verbose_name=_("sender nickname"))
    sender_cardname = models.CharField(max_length=255, blank=True, verbose_name=_("sender cardname"))
    receiver_id = models.CharField(max_length=128, blank=True, verbose_name=_("receiver id"))
    segments = ReadableJSONField(default=list, placeholder=UNREADABLE_SEGMENTS, verbose_name=_("segments"))
    text = models.TextField(blank=True, verbose_name=_("text"))
    # The platform id of the quoted message, when this message quotes one.
    reply_to_platform_id = models.CharField(max_length=128, blank=True, verbose_name=_("reply to platform id"))
    extra = models.JSONField(default=dict, blank=True, verbose_name=_("extra"))
    time = models.DateTimeField(db_index=True, verbose_name=_("time"))
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))
    # Outbound delivery (empty for inbound).
    delivery_status = models.CharField(
        max_length=12, choices=DeliveryStatus.choices, blank=True, verbose_name=_("delivery status")
    )
    delivery_error = models.CharField(max_length=255, blank=True, verbose_name=_("delivery error"))
    # Hand-overs so far (each claim counts one).
    delivery_attempts = models.PositiveIntegerField(default=0, verbose_name=_("delivery attempts"))
    delivery_claim = models.CharField(max_length=64, blank=True, verbose_name=_("delivery claim"))
    delivery_lease_until = models.DateTimeField(null=True, blank=True, verbose_name=_("delivery lease until"))
    # The instance (maibot.ProcessHeartbeat.instance) of the process that claimed it last: while the row
    # is `sending` and that process's heartbeat has run out, the claim is taken back without waiting out
    # the lease. NULL: never claimed (nullable: adding the column to a large table is instant on SQLite).
    delivery_claimed_by = models.CharField(max_length=32, null=True, blank=True, verbose_name=_("delivery claimed by"))
    # For a platform that echoes: on a `sent` row, when it is handed over again unless its echo came
    # first (confirm_seconds, doubling per attempt); on a `pending` row, not claimed before this.
    # Empty once the row's fate is settled.
    next_attempt_at = models.DateTimeField(null=True, blank=True, verbose_name=_("next attempt at"))
    # When its frame was last handed to the adapter's socket.
    sent_at = models.DateTimeField(null=True, blank=True, verbose_name=_("sent at"))
    # When the platform confirmed it (the adapter's message_id_echo arrived).
    delivered_at = models.DateTimeField(null=True, blank=True, verbose_name=_("delivered at"))

    class Meta:
        verbose_name = _("message")
        verbose_name_plural = _("messages")
        ordering = ["time", "id"]
        permissions = [
            ("resend_message", gettext_noop("Can resend unconfirmed or failed outbound messages")),
            # The console's send box (console.transcript): writes into a chat through the one send service.
            ("send_operator_message", gettext_noop("Can write into a chat as the operator")),
        ]
        constraints = [
            models.CheckConstraint(
                name="message_delivery_only_outbound",
                condition=(Q(direction="in") & Q(delivery_status="")) | (Q(direction="out") & ~Q(delivery_status="")),
            ),
            models.CheckConstraint(
                name="message_sent_has_time",
                condition=~Q(delivery_status__in=["sent", "unconfirmed"]) | Q(sent_at__isnull=False),
            ),
            models.CheckConstraint(
                name="message_delivered_has_time",
                condition=~Q(delivery_status="delivered") | Q(delivered_at__isnull=False),
            ),
        ]
        indexes = [
            models.Index(fields=["session", "time"]),
            models.Index(fields=["delivery_status", "id"], name="message_outbox_idx"),
            # Only rows waiting for an echo (or for their next hand-over) carry next_attempt_at: the
            # redelivery scan reads this small index, not every sent row ever.
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(next_attempt_at__isnull=False),
                name="message_redelivery_idx",
            ),
            models.Index(fields=["session", "platform_message_id"]),
        ]

    def __str__(self) -> str:
        return f"{self.get_direction_display()} {self.text[:40]}"


class MediaKind(models.TextChoices):
    IMAGE = "image", _("Image")
    EMOJI = "emoji", _("Emoji")
    VOICE = "voice", _("Voice")


def media_upload_to(instance: Media, filename: str) -> str:
    return f"{instance.kind}/{instance.sha256[:2]}/{filename}"


class Media(models.Model):
    """An image, emoji or voice clip, stored once by content hash; messages reference it by hash. An
    emoji a plugin registered (emoji.register) names it in `registered_by`: only it may delete it."""

    sha256 = models.CharField(max_length=64, verbose_name=_("content hash (SHA-256)"))
    kind = models.CharField(max_length=8, choices=MediaKind.choices, verbose_name=_("kind"))
    file = models.FileField(upload_to=media_upload_to, max_length=255, verbose_name=_("file"))
    mime = models.CharField(max_length=64, blank=True, verbose_name=_("MIME type"))
    size = models.PositiveIntegerField(default=0, verbose_name=_("size (bytes)"))
    description = models.TextField(blank=True, verbose_name=_("description"))
    emotion = models.CharField(max_length=64, blank=True, verbose_name=_("emotion"))
    usage_count = models.PositiveIntegerField(default=0, verbose_name=_("times used"))
    registered_by = models.CharField(max_length=128, blank=True, verbose_name=_("registered by plugin"))
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))

    class Meta:
        constraints = [models.UniqueConstraint(fields=["sha256", "kind"], name="media_unique_hash_kind")]
        verbose_name = _("media")
        verbose_name_plural = _("media")

    def __str__(self) -> str:
        return f"{self.kind} {self.sha256[:12]}"


class Emoji(Media):
    """The emoji library: the media rows of kind emoji (filter by it), described by the operator."""

    class Meta:
        proxy = True
        verbose_name = _("emoji")
        verbose_name_plural = _("emoji library")


class CommandResponse(models.Model):
    """A `command_response` receipt from an adapter, stored as it came."""

    platform = models.CharField(max_length=64)
    command_name = models.CharField(max_length=128, blank=True)
    success = models.BooleanField(default=False)
    payload = ReadableJSONField(default=dict, placeholder={"unreadable": "nested too deeply to show"})
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = _("command response")
        verbose_name_plural = _("command responses")


class AdapterPlatform(models.Model):
    """What we know about a platform's adapter across its connections and our restarts."""

    platform = models.CharField(max_length=64, unique=True, verbose_name=_("platform"))
    # Set by the first message_id_echo: from then on a hand-over without an echo is redelivered.
    first_echo_at = models.DateTimeField(null=True, blank=True, verbose_name=_("first echo at"))
    last_echo_at = models.DateTimeField(null=True, blank=True, verbose_name=_("last echo at"))
    # Set when a connection that stayed up showed the adapter does not echo (chat.delivery_gate): from
    # then on its connections take whatever is due, at most once. An echo wins over it.
    no_echo_at = models.DateTimeField(null=True, blank=True, verbose_name=_("no echo at"))
    # The segment types the adapter last said it accepts (format_info.accept_format), kept across
    # reconnects until it says otherwise.
    accept_format = models.JSONField(default=list, blank=True, verbose_name=_("accept format"))
    # The bot's own account on the platform, where the adapter tells it (bot.platform_accounts wins).
    bot_account = models.CharField(max_length=128, blank=True, verbose_name=_("bot account"))
    updated_at = models.DateTimeField(auto_now=True, verbose_name=_("updated at"))

    class Meta:
        verbose_name = _("adapter platform")
        verbose_name_plural = _("adapter platforms")
        ordering = ["platform"]

    def __str__(self) -> str:
        return self.platform

    @property
    def echoes(self) -> bool:
        return self.first_echo_at is not None

    @property
    def never_echoes(self) -> bool:
        return self.first_echo_at is None and self.no_echo_at is not None


class AdapterConnection(models.Model):
    """One adapter websocket connection, kept so every process (and the dashboard) knows who is online."""

    platform = models.CharField(max_length=64, db_index=True)
    protocol = models.CharField(max_length=16)  # "ws" (0.6.x) or "socketio" (0.7.x)
    channel_name = models.CharField(max_length=255, blank=True)
    remote = models.CharField(max_length=255, blank=True)
    accept_format = models.JSONField(default=list, blank=True)
    connected_at = models.DateTimeField(auto_now_add=True)
    disconnected_at = models.DateTimeField(null=True, blank=True)
    close_code = models.IntegerField(null=True, blank=True)

    class Meta:
        verbose_name = _("adapter connection")
        verbose_name_plural = _("adapter connections")
        ordering = ["-connected_at"]


# --- the planner's record -------------------------------------------------------------------------


class CycleKind(models.TextChoices):
    CHAT = "chat", _("Chat planner")
    LIFE = "life", _("Life loop")


class PlannerCycle(models.Model):
    """One observe → plan → execute cycle (or one life-loop turn), kept for the next cycle and operators."""

    cycle_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False, verbose_name=_("cycle id"))
    kind = models.CharField(max_length=8, choices=CycleKind.choices, default=CycleKind.CHAT, verbose_name=_("kind"))
    session = models.ForeignKey(
        ChatSession, null=True, blank=True, on_delete=models.CASCADE, related_name="cycles", verbose_name=_("session")
    )
    started_at = models.DateTimeField(db_index=True, verbose_name=_("started at"))
    ended_at = models.DateTimeField(null=True, blank=True, verbose_name=_("ended at"))
    timings = models.JSONField(default=dict, blank=True, verbose_name=_("timings"))  # phase → milliseconds
    action = models.CharField(max_length=64, blank=True, verbose_name=_("action"))  # reply | no_reply | ...
    reasoning = models.TextField(blank=True, verbose_name=_("reasoning"))
    outcome = models.TextField(blank=True, verbose_name=_("outcome"))
    replanned = models.BooleanField(default=False, verbose_name=_("replanned"))
    trigger = models.CharField(max_length=255, blank=True, verbose_name=_("trigger"))
    # The rendered messages sent to the model
    prompt = models.JSONField(default=list, blank=True, verbose_name=_("prompt"))
    error = models.TextField(blank=True, verbose_name=_("error"))

    class Meta:
        verbose_name = _("planner cycle")
        verbose_name_plural = _("planner cycles")
        ordering = ["-started_at"]
        indexes = [models.Index(fields=["session", "started_at"])]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.cycle_id} {self.action}"


class ToolCallRecord(models.Model):
    """One tool call the model made in a cycle, with its arguments and result."""

    cycle = models.ForeignKey(
        PlannerCycle, on_delete=models.CASCADE, related_name="tool_calls", verbose_name=_("cycle")
    )
    round = models.PositiveSmallIntegerField(default=0, verbose_name=_("round"))
    tool_call_id = models.CharField(max_length=128, blank=True, db_index=True, verbose_name=_("tool call id"))
    name = models.CharField(max_length=128, verbose_name=_("name"))
    arguments = models.JSONField(default=dict, blank=True, verbose_name=_("arguments"))
    raw_arguments = models.TextField(blank=True, verbose_name=_("raw arguments"))
    result = models.JSONField(default=dict, blank=True, verbose_name=_("result"))
    ok = models.BooleanField(default=True, verbose_name=_("ok"))
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))

    class Meta:
        verbose_name = _("tool call record")
        verbose_name_plural = _("tool call records")
        ordering = ["id"]


class LLMCall(models.Model):
    """The ledger: every call to a model, with its tokens, latency and cost."""

    cycle = models.ForeignKey(
        PlannerCycle,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="llm_calls",
        verbose_name=_("cycle"),
    )
    session = models.ForeignKey(
        ChatSession, null=True, blank=True, on_delete=models.SET_NULL, verbose_name=_("session")
    )
    purpose = models.CharField(max_length=32, verbose_name=_("purpose"))  # planner | life | summary | ...
    # One of planner | life | summary | utility
    task = models.CharField(max_length=16, blank=True, db_index=True, verbose_name=_("task"))
    model = models.CharField(max_length=128, verbose_name=_("model"))  # the provider's model id
    model_name = models.CharField(max_length=64, blank=True, verbose_name=_("model name"))  # its llm.models name
    # 0: the task's first model; 1, 2…: fallbacks
    attempt = models.PositiveSmallIntegerField(default=0, verbose_name=_("attempt"))
    prompt_tokens = models.PositiveIntegerField(default=0, verbose_name=_("prompt tokens"))
    completion_tokens = models.PositiveIntegerField(default=0, verbose_name=_("completion tokens"))
    cached_tokens = models.PositiveIntegerField(default=0, verbose_name=_("cached tokens"))
    latency_ms = models.PositiveIntegerField(default=0, verbose_name=_("latency ms"))
    cost = models.DecimalField(max_digits=12, decimal_places=6, default=0, verbose_name=_("cost"))
    error = models.TextField(blank=True, verbose_name=_("error"))
    created_at = models.DateTimeField(auto_now_add=True, db_index=True, verbose_name=_("created at"))

    class Meta:
        verbose_name = _("LLM call")
        verbose_name_plural = _("LLM calls")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return gettext("LLM call %(id)s: %(model)s") % {"id": self.pk, "model": self.model}


class LLMSpend(models.Model):
    """One budget's spend on one local day (bot time zone): the counter capped calls are admitted
    against, by a conditional UPDATE, so a cap holds across server and cluster processes."""

    day = models.DateField()
    scope = models.CharField(max_length=16)  # model | task | session
    target = models.CharField(max_length=64)  # the model's or task's name, the session's pk
    tokens = models.BigIntegerField(default=0)
    cost = models.DecimalField(max_digits=16, decimal_places=6, default=0)
    calls = models.PositiveIntegerField(default=0)  # calls admitted
    refused = models.PositiveIntegerField(default=0)  # calls not made because the cap was reached
    alerted_at = models.DateTimeField(null=True, blank=True)  # when the operators were told it is reached

    class Meta:
        verbose_name = _("daily LLM spend")
        verbose_name_plural = _("daily LLM spend")
        ordering = ["-day", "scope", "target"]
        constraints = [models.UniqueConstraint(fields=["day", "scope", "target"], name="llmspend_one_row_per_day")]

    def __str__(self) -> str:
        return f"{self.day} {self.scope} {self.target}"


# --- the proactive API's credentials --------------------------------------------------------------


class ApiScope(models.TextChoices):
    """What a proactive API (and MCP endpoint) token may do."""

    SEND = "send", _("Send and schedule messages (and find conversations to send to)")
    READ_OWN = "read_own", _("Read the messages it created")
    READ_ALL = "read_all", _("Read every proactive message")
    CANCEL = "cancel", _("Cancel the pending messages it may read")
    # The MCP endpoint (/mcp) offers more than the HTTP API: these scopes unlock its other tools.
    HISTORY = "history", _("Read the recent messages of the conversations it may reach (MCP)")
    MEMORY = "memory", _("List, add and remove memory slots (MCP)")
    TIMERS = "timers", _("List, set and cancel timers (MCP)")
    INNER_STATE = "inner_state", _("Read and update the bot's inner state (MCP)")


def default_api_scopes() -> list[str]:
    """New tokens: send, and read and cancel their own messages only."""
    return [ApiScope.SEND, ApiScope.READ_OWN, ApiScope.CANCEL]


class ApiToken(models.Model):
    """A bearer token for the proactive message API; only its hash is stored. It may do what its scopes
    say, to the conversations it is allowed (empty lists: every channel but the operators' browser chat)."""

    name = models.CharField(max_length=100, unique=True, verbose_name=_("name"))
    prefix = models.CharField(max_length=12, editable=False, verbose_name=_("prefix"))
    token_hash = models.CharField(max_length=64, unique=True, editable=False, verbose_name=_("token hash"))
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, verbose_name=_("created by")
    )
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))
    last_used_at = models.DateTimeField(null=True, blank=True, verbose_name=_("last used at"))
    revoked_at = models.DateTimeField(null=True, blank=True, verbose_name=_("revoked at"))
    scopes = models.JSONField(default=default_api_scopes, verbose_name=_("scopes"))
    # Platforms (e.g. ["qq"]) and conversation (session) ids.
    allowed_channels = models.JSONField(default=list, blank=True, verbose_name=_("allowed channels"))
    allowed_conversations = models.JSONField(default=list, blank=True, verbose_name=_("allowed conversations"))

    class Meta:
        verbose_name = _("API token")
        verbose_name_plural = _("API tokens")
        permissions = [("revoke_apitoken", gettext_noop("Can revoke API tokens"))]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class KnowledgeEntry(models.Model):
    """An entry of the operator's knowledge store, what knowledge.search finds unless disabled."""

    title = models.CharField(max_length=200, verbose_name=_("title"))
    content = models.TextField(max_length=20_000, verbose_name=_("text"))
    enabled = models.BooleanField(default=True, verbose_name=_("enabled"))
    updated_at = models.DateTimeField(auto_now=True, db_index=True, verbose_name=_("updated at"))

    class Meta:
        verbose_name = _("knowledge entry")
        verbose_name_plural = _("knowledge")

    def __str__(self) -> str:
        return self.title
