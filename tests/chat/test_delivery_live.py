"""Delivery confirmed by the platform against a real daphne, with the NapCat stand-in (the real
maim_message 0.6.8 client behaving as MaiBot-Napcat-Adapter 0.7.0 does): an adapter restart while
NapCat is still away (on a platform that echoed, and on a fresh one before its first echo), a
NapCat-only outage, an echo that never comes, a server that died with a row
`sending`, and a frozen (SIGSTOP) adapter. Small confirm windows in the servers' bot configs keep them
short; the in-process twins with an injected clock are in test_delivery.py."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from datetime import timedelta

import pytest
from django.utils import timezone

from chat.models import AdapterConnection, AdapterPlatform, Message
from chat.services import message_send
from tests.chat.gateway_helpers import write_bot_config, ws_url
from tests.chat.napcat_standin import NapCat, NapCatStandIn
from tests.conftest import ROOT, SHARED_ENV, db, launch_daphne, subprocess_env, wait_for_async

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

# Confirm windows of 2 s (hand-overs at 0, 2, 6 s): short enough for the scenarios, long enough that an
# echo on a loaded machine always lands inside its window.
FAST_CONFIRM = "[gateway]\nconfirm_seconds = 2.0\nmax_delivery_attempts = 3\nkeepalive_seconds = 6.0\n"


@pytest.fixture(scope="module")
def _confirm_server(django_db_setup, tmp_path_factory):
    """One daphne for this module's scenarios, with FAST_CONFIRM. Each test uses a platform of its own:
    the server keeps what it learned about a platform (it echoes) in memory across tests."""
    root = tmp_path_factory.mktemp("delivery-server")
    write_bot_config(root / "data", FAST_CONFIRM)
    proc, base = launch_daphne(root / "data", root / "daphne.log", **SHARED_ENV)
    yield proc, base
    proc.stop()


@pytest.fixture
def server(_confirm_server, transactional_db) -> str:
    proc, base = _confirm_server
    assert proc.popen.poll() is None, proc.output()
    return base


def status_of(message: Message) -> Message:
    return Message.objects.get(pk=message.pk)


async def delivered(*messages: Message, timeout: float = 30) -> list[Message]:
    ids = [m.pk for m in messages]

    def all_delivered():
        rows = list(Message.objects.filter(pk__in=ids, delivery_status="delivered").order_by("id"))
        return rows if len(rows) == len(ids) else None

    return await wait_for_async(all_delivered, timeout=timeout, what=f"messages {ids} delivered")


async def echoing_adapter(base: str, session, platform: str) -> NapCatStandIn:
    """A stand-in whose platform has echoed (a first message delivered through it)."""
    adapter = await NapCatStandIn(base, platform=platform).start()
    warm = await db(message_send, session=session, source_kind="proactive", text="warm-up")
    await delivered(warm)
    assert await db(lambda: AdapterPlatform.objects.get(platform=platform).echoes)
    return adapter


async def until(check, what: str, timeout: float = 20):
    async def run():
        return check()

    return await wait_for_async(run, timeout=timeout, what=what)


async def test_an_adapter_restart_with_three_due_messages_delivers_each_once_after_napcat_returns(server, make_session):
    platform = "qq-restart"
    session = await db(make_session, platform=platform)
    first = await echoing_adapter(server, session, platform)
    await first.stop()
    await wait_for_async(
        lambda: not AdapterConnection.objects.filter(platform=platform, disconnected_at__isnull=True).exists(),
        what="the adapter gone",
    )
    due = [await db(message_send, session=session, source_kind="scheduled_send", text=f"due {i}") for i in range(3)]

    # The adapter is back before NapCat (as measured: NapCat reconnects 1.4–2.1 s after it).
    second = await NapCatStandIn(server, platform=platform, napcat=NapCat(up=False)).start()
    try:
        await until(lambda: second.dropped, "the first hand-over dropped by the adapter while NapCat is away")
        assert second.dropped == [("napcat_down", str(due[0].uid))]
        # Only the oldest was claimed for the unproven connection: the others were never handed over.
        assert [r.delivery_attempts for r in await db(lambda: [status_of(m) for m in due])] == [1, 0, 0]

        second.napcat.up = True
        rows = await delivered(*due)
        assert second.napcat.texts() == ["due 0", "due 1", "due 2"]  # each once, in order
        assert [r.delivery_attempts for r in rows] == [2, 1, 1]
        assert all(r.delivered_at >= r.sent_at for r in rows)
    finally:
        await second.stop()


async def test_a_fresh_platform_whose_adapter_restarts_before_its_first_echo_delivers_every_due_message_once(
    start_server, tmp_path, make_session
):
    # The scenario: fresh data, the bot's first reply, and the adapter restarted before that
    # reply's echo came (NapCat delivered it but answers slowly), back before NapCat. 4 s confirm
    # windows (hand-overs at 0, 4, 12 s): the restart comes well inside the first reply's window.
    write_bot_config(tmp_path / "data-fresh", FAST_CONFIRM.replace("confirm_seconds = 2.0", "confirm_seconds = 4.0"))
    _, base = start_server("fresh")
    platform = "qq-fresh"
    session = await db(make_session, platform=platform)
    napcat = NapCat(answer_delay=2.0)
    first = await NapCatStandIn(base, platform=platform, napcat=napcat).start()
    reply = await db(message_send, session=session, source_kind="reply", text="first reply")
    await until(lambda: napcat.texts() == ["first reply"], "NapCat delivered the first reply")

    # The adapter restarts; NapCat's socket to it closes with it, the answer (and so the echo) is lost.
    napcat.up = False
    await first.stop()
    await wait_for_async(
        lambda: not AdapterConnection.objects.filter(platform=platform, disconnected_at__isnull=True).exists(),
        what="the adapter gone",
    )
    assert (await db(status_of, reply)).delivery_status == "sent"  # no echo came: the platform is unproven
    due = [await db(message_send, session=session, source_kind="scheduled_send", text=f"due {i}") for i in range(3)]

    second = await NapCatStandIn(base, platform=platform, napcat=napcat).start()
    try:
        await until(lambda: second.dropped, "a hand-over dropped by the adapter while NapCat is away")
        assert second.dropped == [("napcat_down", str(due[0].uid))]
        # One message on trial: the others were never handed to an adapter not yet shown to deliver.
        assert [r.delivery_attempts for r in await db(lambda: [status_of(m) for m in due])] == [1, 0, 0]

        napcat.answer_delay, napcat.up = 0.0, True  # NapCat reconnects to the new adapter
        rows = await delivered(*due)
        assert napcat.texts() == ["first reply", "due 0", "due 1", "due 2"]  # each once, in order
        assert [r.delivery_attempts for r in rows] == [2, 1, 1]
        assert second.received_ids() == [str(due[0].uid), *[str(m.uid) for m in due]]
        # The first reply's fate is unknown to us (its echo was lost): it was not handed over twice.
        first_row = await db(status_of, reply)
        assert (first_row.delivery_status, first_row.delivery_attempts, first_row.next_attempt_at) == ("sent", 1, None)
        known = await db(lambda: AdapterPlatform.objects.get(platform=platform))
        assert known.echoes and known.no_echo_at is None
    finally:
        await second.stop()


async def test_a_napcat_outage_is_bridged_one_message_at_a_time_and_everything_arrives_once(server, make_session):
    platform = "qq-outage"
    session = await db(make_session, platform=platform)
    adapter = await echoing_adapter(server, session, platform)
    try:
        adapter.napcat.up = False
        out = [await db(message_send, session=session, source_kind="proactive", text=f"out {i}") for i in range(3)]
        uids = [str(m.uid) for m in out]
        # A proven connection takes them all; NapCat is away, the adapter drops them without a word.
        await until(lambda: len(adapter.dropped) == 3, "three frames dropped")
        # No echo within the confirm window: the connection is on probation; the oldest goes again, alone.
        await wait_for_async(
            lambda: Message.objects.filter(pk=out[0].pk, delivery_attempts=2).exists(), what="a second hand-over"
        )
        assert [r.delivery_attempts for r in await db(lambda: [status_of(m) for m in out])] == [2, 1, 1]
        await until(lambda: len(adapter.dropped) == 4, "the second copy dropped too")
        assert adapter.received_ids()[1:] == [*uids, uids[0]]  # after the warm-up

        adapter.napcat.up = True
        rows = await delivered(*out)
        assert adapter.napcat.texts() == ["warm-up", "out 0", "out 1", "out 2"]
        assert [r.delivery_attempts for r in rows] == [3, 2, 2]
    finally:
        await adapter.stop()


async def test_a_message_whose_echo_never_comes_is_handed_over_at_most_the_attempt_limit(
    start_server, tmp_path, make_session
):
    # No echo ever comes here, so nothing can race a window: 1 s windows (hand-overs at 0, 1 and 3 s,
    # unconfirmed at 7 s), on a server of its own.
    write_bot_config(
        tmp_path / "data-echo-lost", FAST_CONFIRM.replace("confirm_seconds = 2.0", "confirm_seconds = 1.0")
    )
    _, base = start_server("echo-lost")
    platform = "qq-echo-lost"
    session = await db(make_session, platform=platform)
    adapter = await echoing_adapter(base, session, platform)
    try:
        adapter.napcat.answers = False  # NapCat delivers, its answer never reaches the adapter
        lost = await db(message_send, session=session, source_kind="proactive", text="echo lost")
        row = await wait_for_async(
            lambda: Message.objects.filter(pk=lost.pk, delivery_status="unconfirmed").first(),
            timeout=30,
            what="unconfirmed after the attempt limit",
        )
        assert (row.delivery_error, row.delivery_attempts, row.delivered_at) == ("no_echo", 3, None)
        # The trade-off, bounded: the user got it three times, never a fourth.
        assert adapter.napcat.texts().count("echo lost") == 3
        assert adapter.received_ids().count(str(lost.uid)) == 3
    finally:
        await adapter.stop()


async def test_a_row_left_sending_by_a_crashed_server_is_delivered_once(tmp_path, transactional_db, make_session):
    platform = "qq-crash"
    session = await db(make_session, platform=platform)
    for name in ("a", "b"):
        write_bot_config(tmp_path / f"data-{name}", FAST_CONFIRM)
    crashed, base = launch_daphne(tmp_path / "data-a", tmp_path / "a.log")
    procs = [crashed]
    try:
        adapter = await echoing_adapter(base, session, platform)
        await adapter.stop()
        crashed.stop(signal.SIGKILL)
        # What a server killed right after claiming a row leaves behind: the row `sending` under its
        # claim and lease, not yet written to the adapter.
        row = await db(message_send, session=session, source_kind="proactive", text="claimed then crashed")
        await db(
            lambda: Message.objects.filter(pk=row.pk).update(
                delivery_status="sending",
                delivery_claim="crashed-server",
                delivery_lease_until=timezone.now() - timedelta(seconds=1),
                delivery_attempts=1,
            )
        )
        restarted, base = launch_daphne(tmp_path / "data-b", tmp_path / "b.log")
        procs.append(restarted)
        adapter = await NapCatStandIn(base, platform=platform).start()
        try:
            (done,) = await delivered(row)
            assert adapter.napcat.texts() == ["claimed then crashed"]
            assert done.delivery_attempts == 2 and done.delivery_error == ""
        finally:
            await adapter.stop()
    finally:
        for proc in procs:
            proc.stop()


async def test_a_frozen_adapter_is_dropped_within_the_keepalive_and_what_it_swallowed_is_redelivered(
    tmp_path, transactional_db, make_session
):
    platform = "qq-frozen"
    session = await db(make_session, platform=platform)
    # Confirm windows of 2 s (hand-overs at 0, 2, 6 s): the one message on probation outlasts the
    # up to 6 s a frozen peer takes to be dropped.
    write_bot_config(tmp_path / "data-k", "[gateway]\nconfirm_seconds = 2.0\nkeepalive_seconds = 6.0\n")
    server, base = launch_daphne(tmp_path / "data-k", tmp_path / "k.log")
    standin_log = tmp_path / "frozen-standin.log"
    with standin_log.open("wb") as stderr:
        frozen = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.chat.napcat_standin",
            ws_url(base),
            platform,
            cwd=ROOT,
            env=subprocess_env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
        )
    try:
        first = await asyncio.wait_for(frozen.stdout.readline(), 60)
        # A stand-in that exits before it connects (it cannot start, or is refused) says why in its log.
        assert first.startswith(b"{") and json.loads(first) == {"event": "connected"}, (
            f"the stand-in said {first!r}:\n{standin_log.read_text(errors='replace')}"
        )
        warm = await db(message_send, session=session, source_kind="proactive", text="warm-up")
        await delivered(warm)

        frozen.send_signal(signal.SIGSTOP)
        stopped_at = timezone.now()
        swallowed = [await db(message_send, session=session, source_kind="proactive", text=f"m{i}") for i in range(3)]
        record = await wait_for_async(
            lambda: AdapterConnection.objects.filter(platform=platform, disconnected_at__isnull=False).first(),
            timeout=15,
            what="the frozen adapter dropped",
        )
        noticed = (record.disconnected_at - stopped_at).total_seconds()
        assert noticed < 6.0, f"noticed after {noticed:.1f} s"
        # Handed to the frozen adapter: the three while it looked healthy, then only the oldest again.
        attempts = [r.delivery_attempts for r in await db(lambda: [status_of(m) for m in swallowed])]
        assert attempts in ([1, 1, 1], [2, 1, 1]), attempts

        frozen.kill()
        await frozen.wait()
        adapter = await NapCatStandIn(base, platform=platform).start()
        try:
            rows = await delivered(*swallowed)
            assert adapter.napcat.texts() == ["m0", "m1", "m2"]
            assert all(r.delivery_attempts <= 3 for r in rows)
        finally:
            await adapter.stop()
    finally:
        if frozen.returncode is None:
            frozen.kill()
            await frozen.wait()
        server.stop()


async def test_a_group_reply_reaches_the_group_through_the_adapter(server, make_session):
    # The adapter sends to a group only when the envelope carries user_info too (the bot's own account).
    platform = "qq-group"
    session = await db(make_session, "group", platform=platform, group_id="555", group_name="g")
    adapter = await NapCatStandIn(server, platform=platform).start()
    try:
        reply = await db(message_send, session=session, source_kind="reply", text="hello group")
        await until(lambda: adapter.received, "the frame at the adapter")
        await until(lambda: adapter.dropped or adapter.napcat.delivered, "the adapter's verdict")
        assert adapter.dropped == []
        (sent,) = adapter.napcat.delivered
        assert (sent.action, str(sent.target)) == ("send_group_msg", "555")
        await delivered(reply)
    finally:
        await adapter.stop()
