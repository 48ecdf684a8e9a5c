"""emoji.* through the real maibot-plugin-sdk's PluginContext, over the emoji library (chat.Emoji): MaiBot
1.3's shapes ({base64, description, emotion}, counts, tags, info, register and delete results), the
same pick as the planner's send_emoji; a plugin registers from its media budget and deletes only what it
registered and no message shows; the operator describes emojis in the admin, a viewer cannot."""

from __future__ import annotations

import base64
import hashlib
import re

import pytest
from django.contrib.auth.models import Permission, User

from chat.media import media_store
from chat.models import Emoji, Media, Message
from core import config
from tests.chat.planner_helpers import inbound_store
from tests.plugins.sdk_context import plugin, run

pytestmark = pytest.mark.django_db(transaction=True)

EMOJI_CAPS = [
    "emoji.get_by_description", "emoji.get_random", "emoji.get_count", "emoji.get_emotions", "emoji.get_all",
    "emoji.get_info", "emoji.register", "emoji.delete",
]  # fmt: skip


def image(n: int, size: int = 40) -> bytes:
    """Bytes our media store takes for an image (PNG magic, then `n`-distinct filler)."""
    return b"\x89PNG\r\n\x1a\n" + bytes([n % 256]) * size


def library(settings, tmp_path) -> dict[str, Media]:
    settings.DATA_DIR = tmp_path
    settings.MEDIA_ROOT = tmp_path / "media"
    happy = media_store(data=image(1), kind="emoji", description="开心，高兴、快乐")
    sad = media_store(data=image(2), kind="emoji", description="sad, crying")
    plain = media_store(data=image(3), kind="emoji")
    media_store(data=image(4), kind="image", description="开心")  # a photo: not an emoji
    return {"happy": happy, "sad": sad, "plain": plain}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_reads_answer_maibots_shapes_and_pick_as_send_emoji_does(settings, tmp_path):
    emojis = library(settings, tmp_path)
    _, ctx = plugin("test.core.emojis", EMOJI_CAPS)

    assert run(ctx.emoji.get_by_description("我很开心")) == {
        "base64": b64(image(1)),
        "description": "开心，高兴、快乐",
        "emotion": "开心",
    }
    assert run(ctx.emoji.get_by_description("angry")) is None  # nothing matches
    assert run(ctx.emoji.get_count()) == 3
    assert run(ctx.emoji.get_emotions()) == sorted(["开心", "高兴", "快乐", "sad", "crying"])
    assert run(ctx.emoji.get_info()) == {"current_count": 3, "max_count": 10_000, "available_emojis": 3}
    every = run(ctx.emoji.get_all())
    assert sorted(e["emotion"] for e in every) == sorted(["开心", "sad", "随机表情"])
    picked = run(ctx.emoji.get_random(2))
    assert len(picked) == 2 and {e["base64"] for e in picked} <= {b64(image(n)) for n in (1, 2, 3)}
    assert run(ctx.emoji.get_random(0)) == []
    assert run(ctx.emoji.get_random(-1))["error"] == "count 不能为负数"
    assert len(run(ctx.emoji.get_random(50))) == 3
    emojis["sad"].file.delete(save=False)  # a file gone: left out, as MaiBot does
    assert len(run(ctx.emoji.get_all())) == 2


def test_a_plugin_registers_from_its_budget_and_deletes_only_its_own(settings, tmp_path):
    emojis = library(settings, tmp_path)
    record, ctx = plugin("test.core.emojis", EMOJI_CAPS)
    _, other = plugin("test.core.other", EMOJI_CAPS)
    digest = hashlib.sha256(image(9)).hexdigest()

    registered = run(ctx.emoji.register_emoji(b64(image(9))))
    assert registered == {
        "success": True, "message": "表情包注册成功 (新增表情包)", "description": "", "emotions": [],
        "replaced": False, "hash": digest,
    }  # fmt: skip
    assert Emoji.objects.get(sha256=digest).registered_by == "test.core.emojis"
    again = run(other.emoji.register_emoji(b64(image(9))))
    assert again["success"] is True and again["message"] == "表情包已注册，已跳过本次注册"
    bad = run(ctx.emoji.register_emoji(b64(b"not an image at all")))
    assert bad["success"] is False and "is not an image" in bad["message"]

    refused = run(other.emoji.delete_emoji(digest))
    assert refused["success"] is False and "was not registered by plugin test.core.other" in refused["message"]
    from_chats = run(ctx.emoji.delete_emoji(emojis["happy"].sha256))
    assert from_chats["success"] is False and Emoji.objects.filter(pk=emojis["happy"].pk).exists()
    assert run(ctx.emoji.delete_emoji("0" * 64))["message"] == f"未找到表情包: {'0' * 64}"
    deleted = run(ctx.emoji.delete_emoji(digest.upper()))
    assert deleted == {"success": True, "message": f"成功删除表情包: {digest}", "hash": digest, "keep_desc": False}
    assert not Emoji.objects.filter(sha256=digest).exists()

    with config.override(plugins={"media_mb_per_minute": 1}):
        with pytest.raises(
            RuntimeError, match=re.escape("refused: plugin test.core.emojis may send 1 MB of media a minute")
        ):
            run(ctx.emoji.register_emoji(b64(image(10, size=1_100_000))))
    assert record.refusals == {"media": 1} and Emoji.objects.filter(kind="emoji").count() == 3


def test_an_emoji_a_message_shows_is_not_deleted(settings, tmp_path, make_session):
    library(settings, tmp_path)
    _, ctx = plugin("test.core.emojis", EMOJI_CAPS)
    digest = run(ctx.emoji.register_emoji(b64(image(11))))["hash"]
    shown = inbound_store(session=make_session(), text="[emoji]")
    Message.objects.filter(pk=shown.pk).update(segments=[{"type": "emoji", "data": {"media": digest}}])
    kept = run(ctx.emoji.delete_emoji(digest))
    assert kept["success"] is False and "is shown by a stored message" in kept["message"]


def test_a_plugin_that_did_not_declare_emoji_register_is_refused(settings, tmp_path):
    library(settings, tmp_path)
    _, ctx = plugin("test.core.reader", ["emoji.get_count"])
    assert run(ctx.emoji.get_count()) == 3
    with pytest.raises(RuntimeError, match=re.escape("emoji.register is not declared in plugin test.core.reader")):
        run(ctx.emoji.register_emoji(b64(image(12))))
    assert Emoji.objects.filter(kind="emoji").count() == 3


def test_the_operator_describes_emojis_in_the_admin_and_a_viewer_cannot(settings, tmp_path, client):
    emojis = library(settings, tmp_path)
    plain = emojis["plain"]
    _, ctx = plugin("test.core.emojis", EMOJI_CAPS)
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_emoji"))
    client.force_login(viewer)
    response = client.get("/admin/chat/emoji/")
    page = response.content.decode()
    assert "开心，高兴、快乐" in page and f'src="data:image/png;base64,{b64(image(1))}"' in page
    assert response.context["cl"].result_count == 3  # the photo is not an emoji
    url = f"/admin/chat/emoji/{plain.pk}/change/"
    assert client.post(url, {"description": "得意", "emotion": ""}).status_code == 403
    assert run(ctx.emoji.get_by_description("得意")) is None

    operator = User.objects.create_superuser("op", password="pw")
    client.force_login(operator)
    assert client.post(url, {"description": "得意", "emotion": "smug"}).status_code == 302
    assert run(ctx.emoji.get_by_description("得意"))["base64"] == b64(image(3))
