"""Chat sessions, their messages (inbound and the outbound outbox), media, and the planner's records."""

from __future__ import annotations

import hashlib
import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q


class ChatType(models.TextChoices):
    PRIVATE = "private", "Private"
    GROUP = "group", "Group"


def make_session_id(platform: str, chat_type: str, target_id: str) -> str:
    """Stable, globally unique id of a conversation: platform + chat type + user or group id."""
    return hashlib.sha1(f"{platform}|{chat_type}|{target_id}".encode()).hexdigest()[:24]


class ChatSession(models.Model):
    session_id = models.CharField(max_length=32, unique=True, editable=False)
    platform = models.CharField(max_length=64)
    chat_type = models.CharField(max_length=16, choices=ChatType.choices)
    # Private chat: the person. Group chat: empty (the group is the target; speakers are on messages).
    user_id = models.CharField(max_length=128, blank=True)
    user_nickname = models.CharField(max_length=255, blank=True)
    user_cardname = models.CharField(max_length=255, blank=True)
    group_id = models.CharField(max_length=128, blank=True)
    group_name = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_active_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-last_active_at"]
        constraints = [
            models.CheckConstraint(
                name="session_target_present",
                condition=(Q(chat_type="private") & ~Q(user_id="")) | (Q(chat_type="group") & ~Q(group_id="")),
            ),
        ]
        indexes = [models.Index(fields=["platform", "chat_type", "user_id"])]

    def __str__(self) -> str:
        if self.chat_type == ChatType.GROUP:
            return f"{self.platform} group {self.group_name or self.group_id}"
        return f"{self.platform} private {self.user_nickname or self.user_id}"

    @property
    def is_private(self) -> bool:
        return self.chat_type == ChatType.PRIVATE

    @property
    def target_id(self) -> str:
        return self.user_id if self.is_private else self.group_id


class Direction(models.TextChoices):
    IN = "in", "Inbound"
    OUT = "out", "Outbound"


class SourceKind(models.TextChoices):
    USER = "user", "User"
    REPLY = "reply", "Planner reply"
    SCHEDULED_SEND = "scheduled_send", "Scheduled send"
    PROACTIVE = "proactive", "Proactive (API)"
    TIMER = "timer", "Timer / life loop"
    ADMIN = "admin", "Operator"


class DeliveryStatus(models.TextChoices):
    """An outbound message's fate. pending → sending → sent (handed to the adapter) → delivered (the
    platform's id came back in the adapter's `message_id_echo`) or unconfirmed (no echo after
    gateway.max_delivery_attempts hand-overs); failed when it could not be handed over at all."""

    PENDING = "pending", "Pending"
    SENDING = "sending", "Sending"
    SENT = "sent", "Sent"
    DELIVERED = "delivered", "Delivered"
    UNCONFIRMED = "unconfirmed", "Unconfirmed"
    FAILED = "failed", "Failed"


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
    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="messages")
    direction = models.CharField(max_length=3, choices=Direction.choices)
    source_kind = models.CharField(max_length=16, choices=SourceKind.choices)
    # The platform's id: from the inbound envelope, or from the adapter's echo receipt for outbound.
    platform_message_id = models.CharField(max_length=128, blank=True)
    sender_id = models.CharField(max_length=128, blank=True)
    sender_nickname = models.CharField(max_length=255, blank=True)
    sender_cardname = models.CharField(max_length=255, blank=True)
    receiver_id = models.CharField(max_length=128, blank=True)
    segments = ReadableJSONField(default=list, placeholder=UNREADABLE_SEGMENTS)
    text = models.TextField(blank=True)
    # The platform id of the quoted message, when this message quotes one.
    reply_to_platform_id = models.CharField(max_length=128, blank=True)
    extra = models.JSONField(default=dict, blank=True)
    time = models.DateTimeField(db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Outbound delivery (empty for inbound).
    delivery_status = models.CharField(max_length=12, choices=DeliveryStatus.choices, blank=True)
    delivery_error = models.CharField(max_length=255, blank=True)
    # Hand-overs so far (each claim counts one).
    delivery_attempts = models.PositiveIntegerField(default=0)
    delivery_claim = models.CharField(max_length=64, blank=True)
    delivery_lease_until = models.DateTimeField(null=True, blank=True)
    # The instance (maibot.ProcessHeartbeat.instance) of the process that claimed it last: while the row
    # is `sending` and that process's heartbeat has run out, the claim is taken back without waiting out
    # the lease. NULL: never claimed (nullable: adding the column to a large table is instant on SQLite).
    delivery_claimed_by = models.CharField(max_length=32, null=True, blank=True)
    # For a platform that echoes: on a `sent` row, when it is handed over again unless its echo came
    # first (confirm_seconds, doubling per attempt); on a `pending` row, not claimed before this.
    # Empty once the row's fate is settled.
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    # When its frame was last handed to the adapter's socket.
    sent_at = models.DateTimeField(null=True, blank=True)
    # When the platform confirmed it (the adapter's message_id_echo arrived).
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["time", "id"]
        permissions = [
            ("resend_message", "Can resend unconfirmed or failed outbound messages"),
            # The console's send box (console.transcript): writes into a chat through the one send service.
            ("send_operator_message", "Can write into a chat as the operator"),
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
    IMAGE = "image", "Image"
    EMOJI = "emoji", "Emoji"
    VOICE = "voice", "Voice"


def media_upload_to(instance: Media, filename: str) -> str:
    return f"{instance.kind}/{instance.sha256[:2]}/{filename}"


class Media(models.Model):
    """An image, emoji or voice clip, stored once by content hash; messages reference it by hash."""

    sha256 = models.CharField(max_length=64)
    kind = models.CharField(max_length=8, choices=MediaKind.choices)
    file = models.FileField(upload_to=media_upload_to, max_length=255)
    mime = models.CharField(max_length=64, blank=True)
    size = models.PositiveIntegerField(default=0)
    description = models.TextField(blank=True)
    emotion = models.CharField(max_length=64, blank=True)
    usage_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["sha256", "kind"], name="media_unique_hash_kind")]

    def __str__(self) -> str:
        return f"{self.kind} {self.sha256[:12]}"


class CommandResponse(models.Model):
    """A `command_response` receipt from an adapter, stored as it came."""

    platform = models.CharField(max_length=64)
    command_name = models.CharField(max_length=128, blank=True)
    success = models.BooleanField(default=False)
    payload = ReadableJSONField(default=dict, placeholder={"unreadable": "nested too deeply to show"})
    received_at = models.DateTimeField(auto_now_add=True)


class AdapterPlatform(models.Model):
    """What we know about a platform's adapter across its connections and our restarts."""

    platform = models.CharField(max_length=64, unique=True)
    # Set by the first message_id_echo: from then on a hand-over without an echo is redelivered.
    first_echo_at = models.DateTimeField(null=True, blank=True)
    last_echo_at = models.DateTimeField(null=True, blank=True)
    # Set when a connection that stayed up showed the adapter does not echo (chat.delivery_gate): from
    # then on its connections take whatever is due, at most once. An echo wins over it.
    no_echo_at = models.DateTimeField(null=True, blank=True)
    # The segment types the adapter last said it accepts (format_info.accept_format), kept across
    # reconnects until it says otherwise.
    accept_format = models.JSONField(default=list, blank=True)
    # The bot's own account on the platform, where the adapter tells it (bot.platform_accounts wins).
    bot_account = models.CharField(max_length=128, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
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
        ordering = ["-connected_at"]


# --- the planner's record -------------------------------------------------------------------------


class CycleKind(models.TextChoices):
    CHAT = "chat", "Chat planner"
    LIFE = "life", "Life loop"


class PlannerCycle(models.Model):
    """One observe → plan → execute cycle (or one life-loop turn), kept for the next cycle and operators."""

    cycle_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    kind = models.CharField(max_length=8, choices=CycleKind.choices, default=CycleKind.CHAT)
    session = models.ForeignKey(ChatSession, null=True, blank=True, on_delete=models.CASCADE, related_name="cycles")
    started_at = models.DateTimeField(db_index=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    timings = models.JSONField(default=dict, blank=True)  # phase → milliseconds
    action = models.CharField(max_length=64, blank=True)  # reply | no_reply | ...
    reasoning = models.TextField(blank=True)
    outcome = models.TextField(blank=True)
    replanned = models.BooleanField(default=False)
    trigger = models.CharField(max_length=255, blank=True)
    prompt = models.JSONField(default=list, blank=True)  # the rendered messages sent to the model
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-started_at"]
        indexes = [models.Index(fields=["session", "started_at"])]

    def __str__(self) -> str:
        return f"{self.kind} cycle {self.cycle_id} {self.action}"


class ToolCallRecord(models.Model):
    """One tool call the model made in a cycle, with its arguments and result."""

    cycle = models.ForeignKey(PlannerCycle, on_delete=models.CASCADE, related_name="tool_calls")
    round = models.PositiveSmallIntegerField(default=0)
    tool_call_id = models.CharField(max_length=128, blank=True, db_index=True)
    name = models.CharField(max_length=128)
    arguments = models.JSONField(default=dict, blank=True)
    raw_arguments = models.TextField(blank=True)
    result = models.JSONField(default=dict, blank=True)
    ok = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]


class LLMCall(models.Model):
    """The ledger: every call to a model, with its tokens, latency and cost."""

    cycle = models.ForeignKey(PlannerCycle, null=True, blank=True, on_delete=models.SET_NULL, related_name="llm_calls")
    session = models.ForeignKey(ChatSession, null=True, blank=True, on_delete=models.SET_NULL)
    purpose = models.CharField(max_length=32)  # planner | life | summary | ...
    task = models.CharField(max_length=16, blank=True, db_index=True)  # planner | life | summary | utility
    model = models.CharField(max_length=128)  # the provider's model id
    model_name = models.CharField(max_length=64, blank=True)  # the config's name for it (llm.models)
    attempt = models.PositiveSmallIntegerField(default=0)  # 0: the task's first model; 1, 2…: fallbacks
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(default=0)
    latency_ms = models.PositiveIntegerField(default=0)
    cost = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]


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
        ordering = ["-day", "scope", "target"]
        constraints = [models.UniqueConstraint(fields=["day", "scope", "target"], name="llmspend_one_row_per_day")]

    def __str__(self) -> str:
        return f"{self.day} {self.scope} {self.target}"


# --- the proactive API's credentials --------------------------------------------------------------


class ApiScope(models.TextChoices):
    """What a proactive API (and MCP endpoint) token may do."""

    SEND = "send", "Send and schedule messages (and find conversations to send to)"
    READ_OWN = "read_own", "Read the messages it created"
    READ_ALL = "read_all", "Read every proactive message"
    CANCEL = "cancel", "Cancel the pending messages it may read"
    # The MCP endpoint (/mcp) offers more than the HTTP API: these scopes unlock its other tools.
    HISTORY = "history", "Read the recent messages of the conversations it may reach (MCP)"
    MEMORY = "memory", "List, add and remove memory slots (MCP)"
    TIMERS = "timers", "List, set and cancel timers (MCP)"
    INNER_STATE = "inner_state", "Read and update the bot's inner state (MCP)"


def default_api_scopes() -> list[str]:
    """New tokens: send, and read and cancel their own messages only."""
    return [ApiScope.SEND, ApiScope.READ_OWN, ApiScope.CANCEL]


class ApiToken(models.Model):
    """A bearer token for the proactive message API; only its hash is stored. It may do what its scopes
    say, to the conversations it is allowed (empty lists: every channel but the operators' browser chat)."""

    name = models.CharField(max_length=100, unique=True)
    prefix = models.CharField(max_length=12, editable=False)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    scopes = models.JSONField(default=default_api_scopes)
    allowed_channels = models.JSONField(default=list, blank=True)  # platforms, e.g. ["qq"]
    allowed_conversations = models.JSONField(default=list, blank=True)  # conversation (session) ids

    class Meta:
        permissions = [("revoke_apitoken", "Can revoke API tokens")]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None
