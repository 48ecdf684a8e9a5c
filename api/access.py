"""Who may use the proactive message API and how often: bearer tokens, the per-token rate limit
shared by every server process, and Idempotency-Key replay."""

from __future__ import annotations

import hashlib
import json
import math
import secrets
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from api.errors import ApiError, ApiErrorCode
from api.models import ApiRateWindow, IdempotencyRecord
from chat.models import ApiScope, ApiToken, default_api_scopes
from core.config import get_config

Code = ApiErrorCode

TOKEN_PREFIX = "mbt_"
# last_used_at is a "seen recently" fact for operators; writing it on every request would add a
# write per call for nothing, so it moves at most once per this interval.
LAST_USED_GRANULARITY = timedelta(seconds=60)
RATE_WINDOW = timedelta(seconds=60)
# How long an Idempotency-Key is remembered (as long as clients are expected to retry).
IDEMPOTENCY_TTL = timedelta(hours=24)


# --- tokens ---------------------------------------------------------------------------------------


def hash_token(raw: str) -> str:
    """The stored form of a token. A 256-bit random token needs no salt or slow hash."""
    return hashlib.sha256(raw.encode()).hexdigest()


def api_token_create(
    *,
    name: str,
    created_by: Any = None,
    scopes: Iterable[str] | None = None,
    allowed_channels: Iterable[str] = (),
    allowed_conversations: Iterable[str] = (),
) -> tuple[ApiToken, str]:
    """Create a token; returns the row and the raw token, which is never stored and shown only now.
    Default scopes: send, and read and cancel its own messages."""
    name = (name or "").strip()
    if not name:
        raise ValueError("a token needs a name")
    scopes = list(dict.fromkeys(scopes)) if scopes is not None else default_api_scopes()
    unknown = [s for s in scopes if s not in ApiScope.values]
    if unknown:
        raise ValueError(f"unknown scope(s) {', '.join(unknown)}; use {', '.join(ApiScope.values)}")
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken(
        name=name,
        prefix=raw[:12],
        token_hash=hash_token(raw),
        created_by=created_by,
        scopes=scopes,
        allowed_channels=_clean_list(allowed_channels),
        allowed_conversations=_clean_list(allowed_conversations),
    )
    token.full_clean()
    token.save(force_insert=True)
    return token, raw


def _clean_list(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(v.strip() for v in values if v and v.strip()))


# --- what a token may do ----------------------------------------------------------------------------

# The operators' own browser chat: reachable only by a token that names this channel explicitly.
PRIVATE_CHANNELS = ("web",)


def token_require(token: ApiToken, scope: ApiScope) -> None:
    """Raise insufficient_scope (403) unless the token has `scope`."""
    if scope not in token.scopes:
        raise ApiError(Code.INSUFFICIENT_SCOPE, f"this token lacks the scope {scope.value!r} ({scope.label.lower()})")


def token_may_reach(token: ApiToken, *, channel: str, conversation_id: str | None = None) -> None:
    """Raise forbidden_conversation (403) unless the token may send to that channel and conversation."""
    if token.allowed_channels:
        allowed = channel in token.allowed_channels
    else:
        allowed = channel not in PRIVATE_CHANNELS
    if allowed and conversation_id is not None and token.allowed_conversations:
        allowed = conversation_id in token.allowed_conversations
    if not allowed:
        raise ApiError(
            Code.FORBIDDEN_CONVERSATION, f"this token may not send to {conversation_id or channel!r}", field=None
        )


def token_is_bounded(token: ApiToken) -> bool:
    """Whether the token is limited to some channels or conversations (so never reaches what is global)."""
    return bool(token.allowed_channels or token.allowed_conversations)


def token_conversations(token: ApiToken, *, via: str = "") -> Q:
    """The conversations a token may reach, as a filter on ChatSession (`via`: the path from the model
    filtered to its session, e.g. "session__"): its channels and conversations when it names some,
    else every channel but the private ones. The same bounds as token_may_reach, for reading."""
    if token.allowed_channels:
        reach = Q(**{f"{via}platform__in": list(token.allowed_channels)})
    else:
        reach = ~Q(**{f"{via}platform__in": PRIVATE_CHANNELS})
    if token.allowed_conversations:
        reach &= Q(**{f"{via}session_id__in": list(token.allowed_conversations)})
    return reach


def token_readable(token: ApiToken) -> Q:
    """The proactive messages a token may read (and so cancel): its own, or all with read_all; either
    way only in the conversations it may reach (read_all on a token bound to channels is every
    message of those channels)."""
    if ApiScope.READ_ALL in token.scopes:
        return token_conversations(token, via="session__")
    if ApiScope.READ_OWN in token.scopes:
        return Q(created_by_token=token) & token_conversations(token, via="session__")
    raise ApiError(Code.INSUFFICIENT_SCOPE, "this token lacks the scope 'read_own' (read the messages it created)")


def api_token_revoke(*, token: ApiToken, now: datetime | None = None) -> bool:
    """Revoke a token for good; False when it already was. Requests with it get 401 from now on."""
    now = now or timezone.now()
    updated = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now)
    token.refresh_from_db(fields=["revoked_at"])
    return bool(updated)


def api_token_authenticate(*, raw: str, now: datetime | None = None) -> ApiToken:
    """The active token for a bearer value, with its last use recorded. Raises ApiError (401)."""
    token = ApiToken.objects.filter(token_hash=hash_token(raw.strip())).first() if raw.strip() else None
    if token is None:
        raise ApiError(Code.INVALID_TOKEN, "the bearer token is not valid")
    if token.revoked_at is not None:
        raise ApiError(Code.TOKEN_REVOKED, "this token has been revoked")
    now = now or timezone.now()
    ApiToken.objects.filter(pk=token.pk).filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - LAST_USED_GRANULARITY)
    ).update(last_used_at=now)
    return token


# --- rate limit -----------------------------------------------------------------------------------


def rate_limit_hit(*, token: ApiToken, now: datetime | None = None) -> int | None:
    """Count one request of this token in the current minute (a database row, so every server
    process shares it). Returns None when allowed, else the seconds until the window resets."""
    limit = get_config().api.rate_limit_per_minute
    now = now or timezone.now()
    window = now.replace(second=0, microsecond=0)
    rows = ApiRateWindow.objects.filter(token=token, window_start=window)
    with transaction.atomic():
        if not rows.update(count=F("count") + 1):
            try:
                with transaction.atomic():
                    ApiRateWindow.objects.create(token=token, window_start=window, count=1)
            except IntegrityError:  # another process opened the window first
                rows.update(count=F("count") + 1)
            else:
                ApiRateWindow.objects.filter(token=token, window_start__lt=window).delete()
        count = rows.values_list("count", flat=True).get()
    if count <= limit:
        return None
    return max(1, math.ceil((window + RATE_WINDOW - now).total_seconds()))


# --- idempotency ----------------------------------------------------------------------------------


def request_fingerprint(*, method: str, path: str, body: bytes) -> str:
    """What makes two requests "the same": method, path and the JSON body (key order and
    whitespace do not matter)."""
    try:
        canonical = json.dumps(json.loads(body or b"null"), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        payload = canonical.encode()
    except ValueError:
        payload = body
    return hashlib.sha256(method.encode() + b" " + path.encode() + b"\n" + payload).hexdigest()


Outcome = tuple[int, dict[str, Any]]


def _run(operation: Callable[[], Outcome]) -> Outcome:
    """Run the operation in a savepoint: a refusal (ApiError) undoes its writes and becomes the answer."""
    try:
        with transaction.atomic():
            return operation()
    except ApiError as exc:
        return exc.status, exc.as_dict()


def idempotent_call(*, token: ApiToken, key: str | None, fingerprint: str, operation: Callable[[], Outcome]) -> Outcome:
    """Run a writing request at most once per (token, Idempotency-Key) and replay its first answer.
    Keys are remembered for IDEMPOTENCY_TTL; the token's older records are dropped here.

    The key's record, the operation's writes and the stored answer commit in ONE transaction, so
    there is never a key without its answer, nor an answer whose writes were lost. A concurrent
    request with the same key blocks on the record's unique index (PostgreSQL) or on the write
    lock (SQLite) until the first commits, then replays its answer: two requests, one message.
    If the first one failed unexpectedly its transaction rolled back and the second simply runs.
    """
    if not key:
        with transaction.atomic():
            return _run(operation)
    with transaction.atomic():
        IdempotencyRecord.objects.filter(token=token, created_at__lt=timezone.now() - IDEMPOTENCY_TTL).delete()
        try:
            with transaction.atomic():
                record = IdempotencyRecord.objects.create(token=token, key=key, request_hash=fingerprint)
        except IntegrityError:
            first = IdempotencyRecord.objects.filter(token=token, key=key).first()
            if first is not None and first.request_hash != fingerprint:
                raise ApiError(
                    Code.IDEMPOTENCY_KEY_REUSED,
                    "this Idempotency-Key was used for a different request; use a new key",
                    field="Idempotency-Key",
                ) from None
            if first is None or first.status_code is None:
                # Cannot happen while answers commit with their record; kept as a clear refusal.
                raise ApiError(
                    Code.REQUEST_IN_PROGRESS, "a request with this Idempotency-Key is still running; retry shortly"
                ) from None
            return first.status_code, first.response
        status, body = _run(operation)
        record.status_code = status
        record.response = body
        record.save(update_fields=["status_code", "response"])
        return status, body
