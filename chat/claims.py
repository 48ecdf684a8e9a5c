"""The claim machine: how a process takes due rows for itself, finishes them, retries or fails them, and
gives back the rows of a process that died. Both delivery stages run on it, each with a `ClaimSpec`
naming its model's fields: scheduled messages (scheduling.dispatcher, into the outbox) and outbound
messages (chat.outbox_rows, handed onto the adapters' sockets by chat.outbox).

The invariants, for every model run on it:

- States. A row is `pending` (anyone may claim it once it is due), `sending` (claimed: it carries a
  claim token, its claimer's instance id and a lease), or out of the machine (sent, failed, …).
- Claiming is one conditional UPDATE, pending → sending, that stamps a fresh token, the claimer and
  the lease, and counts the attempt. Candidates are chosen first by a plain read (no row locks: a
  claim never skips a due row because another statement holds it for a moment); the UPDATE's
  `status = pending` condition alone decides, so of two claimers picking the same rows each row goes to
  one. A claimer owns exactly the rows its UPDATE moved, read back by token.
- Who writes a claimed row: only its claimer, and only through `finish` (or `finish_each`), whose
  UPDATE is conditional on the row still being `sending` under that claimer's token; and the release of
  abandoned claims (`end` on `abandoned`), whose UPDATE names the dead claimers. Every write that ends a claim
  clears the token and the lease. So a claimer that lost its claim (taken back while it was paused)
  finds its marks matching no row, and of two processes releasing at once one UPDATE wins each row.
- A lease is the backstop for a live claimer that never finishes: past `lease`, or as soon as its
  claimer's heartbeat has run out (`dead_claimers`, the database's clock), a `sending` row
  is abandoned, and the release puts it back (pending, or out of the machine where a second attempt
  could duplicate). A live claimer's rows are never taken back within their lease.
- Exactly once: a row is handed on only by the holder of its claim, a claim has one holder at a time
  (the conditional UPDATEs), and a holder hands on only while its heartbeat vouches for the claim
  (core.process.Heartbeat.vouches: it stops vouching before the others may count it dead). Handing on
  and marking are one transaction where the next stage is our database (the dispatcher); where it is a
  socket (the outbox) a hand-over whose mark was lost is resolved by the release's choice: failed (at
  most once), or again within the attempt limit where the platform echoes (at least once, bounded).
- Lock order: on PostgreSQL every UPDATE of the machine takes its row locks in primary-key order, so
  two over the same rows (two releasers, a releaser and a claimer) wait for one another and never
  deadlock; their conditions are checked again once the lock is had.
- Retry or fail: a failed attempt goes back to pending (due after `core.retry.backoff`) while the row
  has attempts left, else out of the machine for good (`retry_or_fail`).
- Expiry: a pending row older than its expiry leaves the machine as failed, never claimed (`expire`;
  the outbox's claim also leaves such rows out of its candidates, the dispatcher expires before it
  claims).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import OperationalError, connection, models, transaction
from django.db.models import F, Q, QuerySet
from django.db.models.functions import Now

from core.models import ProcessHeartbeat
from core.process import instance_id

logger = logging.getLogger(__name__)

# What a claim takes: a function choosing the candidates' keys, or the keys.
Pick = Callable[[], Iterable[Any]] | Collection[Any]


@dataclass(frozen=True)
class ClaimSpec:
    """Which fields of `model` the machine reads and writes, and its two states' values."""

    model: type[models.Model]
    status: str
    pending: str
    sending: str
    token: str
    claimer: str
    lease: str
    attempts: str
    # A column stamped with the instant of every change the machine makes (updated_at), if any.
    touched: str | None = None

    def stamp(self, now: datetime | None) -> dict[str, Any]:
        return {self.touched: now} if self.touched and now is not None else {}

    def released(self) -> dict[str, Any]:
        """The fields every write that ends a claim sets."""
        return {self.token: "", self.lease: None}


def claim(
    spec: ClaimSpec,
    pick: Pick,
    *,
    now: datetime,
    lease_seconds: float,
    claimer: str | None = None,
) -> tuple[str, int]:
    """Claim the pending rows `pick` names for `claimer` (this process, unless a test stands in for
    another); the claim's token. `pick()` chooses the candidates' primary keys, or `pick` is the keys
    themselves. Returns the claim's token and how many rows it took; read them with `held(spec, token)`."""
    token = uuid.uuid4().hex
    ids = list(pick() if callable(pick) else pick)
    if not ids:
        return token, 0
    taken = _update(
        spec.model.objects.filter(pk__in=ids, **{spec.status: spec.pending}),
        **{
            spec.status: spec.sending,
            spec.token: token,
            spec.claimer: claimer or instance_id(),
            spec.lease: now + timedelta(seconds=lease_seconds),
            spec.attempts: F(spec.attempts) + 1,
        },
        **spec.stamp(now),
    )
    return token, taken


def held(spec: ClaimSpec, token: str) -> QuerySet:
    """The rows the claim `token` still holds."""
    return spec.model.objects.filter(**{spec.token: token, spec.status: spec.sending})


def finish(spec: ClaimSpec, token: str, ids: Collection[Any], *, now: datetime | None = None, **fields: Any) -> int:
    """End the claim on the rows `ids` it still holds, setting `fields` (their next state); the count."""
    if not ids:
        return 0
    return end(spec, held(spec, token).filter(pk__in=list(ids)), now=now, **fields)


def end(spec: ClaimSpec, rows: QuerySet, *, now: datetime | None = None, **fields: Any) -> int:
    """End the claims of `rows` (a queryset that names whose: `held` or `abandoned`), setting `fields`."""
    return _update(rows, **spec.released(), **spec.stamp(now), **fields)


def finish_each(spec: ClaimSpec, token: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """`finish` with values of their own per row, as one batch of parameterised UPDATEs (Django's
    bulk_update builds a CASE per row and field, seconds for a burst of 10,000): each of `rows` is the
    row's values for `columns` (database-ready), then its primary key."""
    q = connection.ops.quote_name
    table = q(spec.model._meta.db_table)
    cleared = [f"{q(spec.model._meta.get_field(name).column)} = %s" for name in (spec.token, spec.lease)]
    assigned = [f"{q(spec.model._meta.get_field(name).column)} = %s" for name in columns] + cleared
    pk = q(spec.model._meta.pk.column)
    token_col, status_col = (q(spec.model._meta.get_field(n).column) for n in (spec.token, spec.status))
    sql = f"UPDATE {table} SET {', '.join(assigned)} WHERE {pk} = %s AND {token_col} = %s AND {status_col} = %s"
    # In primary-key order, as the machine's other UPDATEs lock (`_update`): in one transaction with them.
    params = sorted(((*values, "", None, key, token, spec.sending) for *values, key in rows), key=lambda p: p[-3])
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)


def retry_or_fail(rows: QuerySet, *, attempts: str, most: int, retry: dict, fail: dict) -> tuple[int, int]:
    """Rows (in one state, which both `retry` and `fail` leave) with attempts left get `retry`, the
    rest `fail`: (retried, failed)."""
    failed = _update(rows.filter(**{f"{attempts}__gte": most}), **fail)
    retried = _update(rows.filter(**{f"{attempts}__lt": most}), **retry)
    return retried, failed


def dead_claimers() -> QuerySet:
    """The instances whose heartbeat has run out (the database's clock): a subquery for the UPDATE that
    takes their claims back, so that deciding and taking are one statement."""
    return ProcessHeartbeat.objects.filter(alive_until__lt=Now()).values("instance")


def abandoned(spec: ClaimSpec, now: datetime) -> QuerySet:
    """Claimed rows whose claimer's heartbeat has run out, or whose lease has: `end` them in one UPDATE
    (its condition names the dead claimers, so releasers running at once never take a row twice)."""
    return spec.model.objects.filter(**{spec.status: spec.sending}).filter(
        Q(**{f"{spec.lease}__lt": now}) | Q(**{f"{spec.claimer}__in": dead_claimers()})
    )


def expire(spec: ClaimSpec, *, age: str, before: datetime, scope: Q | None = None, **fields: Any) -> int:
    """Pending rows whose `age` field is before `before` leave the machine with `fields`; the count."""
    rows = spec.model.objects.filter(**{spec.status: spec.pending, f"{age}__lt": before})
    return _update(rows.filter(scope) if scope is not None else rows, **fields)


# PostgreSQL's "deadlock detected": it aborted this transaction to break a cycle of waits.
DEADLOCK_DETECTED = "40P01"
DEADLOCK_RETRIES = 3


def _update(rows: QuerySet, **fields: Any) -> int:
    """`rows.update(**fields)` with its row locks taken in primary-key order where the database locks rows
    (PostgreSQL): two of the machine's UPDATEs over the same rows (two releasers, a releaser and a
    claimer) then wait for one another, where locking in their scans' orders could deadlock. The row
    conditions are checked again once a lock is had, so each row still goes to one of them. (SQLite
    writes one transaction at a time.) Should PostgreSQL still find a cycle of waits and abort this
    UPDATE, it is run again, as PostgreSQL's manual advises, up to DEADLOCK_RETRIES times: only when it is
    its own transaction (in a caller's, the whole transaction is lost and the error goes to the caller)."""
    if not connection.features.has_select_for_update:
        return rows.update(**fields)
    own_transaction = not connection.in_atomic_block
    for attempt in range(DEADLOCK_RETRIES + 1):
        try:
            with transaction.atomic(savepoint=False):
                in_order = rows.order_by("pk").select_for_update(of=("self",)).values("pk")
                return rows.filter(pk__in=in_order).update(**fields)
        except OperationalError as exc:
            deadlock = getattr(exc.__cause__, "sqlstate", None) == DEADLOCK_DETECTED
            if not (deadlock and own_transaction and attempt < DEADLOCK_RETRIES):
                raise
            logger.info("claims: PostgreSQL broke a deadlock by aborting an update of %s; running it again", rows.model)
    raise AssertionError("unreachable")
