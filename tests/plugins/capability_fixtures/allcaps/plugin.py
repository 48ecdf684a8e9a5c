"""A test plugin written against the real maibot-plugin-sdk that calls every capability this host
answers (the 20 most declared in MaiBot's public plugin index), the way plugins call them.

`/allcaps` (a command) walks through them in the chat it came from and reports what each answered in
a last text message, `caps: {json}`. `/allcaps-bad` calls each with unusable arguments and reports
what came back: errors, never a crash."""

import json
import time

from maibot_sdk import API, Command, Field, MaiBotPlugin, PluginConfigBase

CARD = (
    "<html><body style='margin:0'><div id='card' style='width:120px;height:40px;background:rgb(0,128,128);"
    "color:white;font:16px sans-serif'>teal</div></body></html>"
)


class PluginSection(PluginConfigBase):
    config_version: str = Field(default="1.0.0", description="Config version")
    enabled: bool = Field(default=True, description="Whether the plugin is enabled")


class AllCapsConfig(PluginConfigBase):
    plugin: PluginSection = Field(default_factory=PluginSection)


class AllCapsPlugin(MaiBotPlugin):
    config_model = AllCapsConfig

    async def on_load(self) -> None:
        pass

    async def on_unload(self) -> None:
        pass

    async def on_config_update(self, scope, config_data, version) -> None:
        pass

    @API("echo", description="Echoes its text, upper-cased", version="1", public=True)
    async def handle_echo(self, text: str = "", **kwargs):
        return {"echo": text.upper()}

    @Command("allcaps", description="Calls every capability", pattern=r"^/allcaps$")
    async def handle_allcaps(self, stream_id: str = "", user_id: str = "", **kwargs):
        ctx = self.ctx
        report = {}
        started = time.time() - 3600
        first = await ctx.send.text("caps: starting", stream_id, return_details=True)
        report["first_sent"] = first["sent"]
        report["first_platform_id"] = first["message_id"]
        found = await ctx.message.get_by_id(first["message_id"] or "", stream_id=stream_id)
        report["get_by_id"] = found["processed_plain_text"] if found else None
        recent = await ctx.message.get_recent(stream_id, limit=5)
        report["get_recent"] = [m["processed_plain_text"] for m in recent]
        in_time = await ctx.message.get_by_time_in_chat(stream_id, str(started), str(time.time() + 60), limit=0)
        report["get_by_time_in_chat"] = len(in_time)
        report["config_get"] = await ctx.config.get("bot.nickname")
        report["models"] = await ctx.llm.get_available_models()
        generated = await ctx.llm.generate("Say a word about teal.")
        report["llm_generate"] = generated.get("response")
        report["api_call"] = await ctx.api.call("test.maibot.allcaps.echo", text="ping")
        report["me"] = (await ctx.chat.get_stream_by_user_id(user_id))["stream_id"] == stream_id
        opened = await ctx.chat.open_session("qq", "group", group_id="9090")
        report["opened_created"] = opened["created"]
        report["group_stream"] = (await ctx.chat.get_stream_by_group_id("9090"))["stream_id"] == opened["stream_id"]
        report["group_streams"] = [s["group_id"] for s in await ctx.chat.get_group_streams()]
        report["all_streams"] = len(await ctx.chat.get_all_streams())

        png = await ctx.render.html2png(CARD, selector="#card", device_scale_factor=1)
        report["render"] = [png["mime_type"], png["width"], png["height"]]
        report["send_image"] = await ctx.send.image(png["image_base64"], stream_id)
        report["send_hybrid"] = await ctx.send.hybrid(
            [{"type": "text", "content": "teal card:"}, {"type": "image", "content": png["image_base64"]}], stream_id
        )
        report["send_forward"] = await ctx.send.forward(
            [
                {"user_id": "10001", "nickname": "Alice", "segments": [{"type": "text", "content": "first node"}]},
                {
                    "user_id": "20002",
                    "nickname": "Bob",
                    "segments": [{"type": "image", "content": png["image_base64"]}],
                },
            ],
            stream_id,
        )
        report["send_custom"] = await ctx.send.custom("music", {"type": "163", "id": "1901371647"}, stream_id)
        appended = await ctx.maisaka.context.append(
            stream_id, [{"type": "text", "content": "The user's favourite colour is teal."}]
        )
        report["context_append"] = appended["success"]
        triggered = await ctx.maisaka.proactive.trigger(stream_id, "tell the user something nice about teal")
        report["proactive"] = triggered["success"]
        await ctx.send.text("caps: " + json.dumps(report, ensure_ascii=False, sort_keys=True), stream_id)
        return True, "walked every capability", True

    @Command("allcaps_bad", description="Calls every capability with unusable arguments", pattern=r"^/allcaps-bad$")
    async def handle_bad(self, stream_id: str = "", **kwargs):
        ctx = self.ctx
        outcomes = {
            "send.text": await ctx.send.text("x" * 20_000, stream_id),
            "send.image": await ctx.send.image("bm90IGFuIGltYWdl", stream_id),
            "send.custom": await ctx.send.custom("bad type!", {"a": 1}, stream_id),
            "send.forward": await ctx.send.forward([], stream_id),
            "send.hybrid": await ctx.send.hybrid([{"type": "text", "content": ""}], stream_id),
            "no_stream": await ctx.send.text("hello", "no-such-stream"),
            "render": await ctx.render.html2png(""),
            "by_time": await ctx.message.get_by_time_in_chat(stream_id, "yesterday", "now"),
            "open_session": await ctx.chat.open_session("qq", "group"),
            "proactive": await ctx.maisaka.proactive.trigger("no-such-stream", "hi"),
            "context": await ctx.maisaka.context.append(stream_id, []),
            "api": await ctx.api.call("test.maibot.nobody.nothing"),
            "llm": await ctx.llm.generate(""),
        }
        try:
            await ctx.call_capability("send.video", video_base64="AAAA", stream_id=stream_id)
            outcomes["video"] = "answered"
        except RuntimeError as exc:
            outcomes["video"] = str(exc)
        await ctx.send.text("bad: " + json.dumps(outcomes, ensure_ascii=False, sort_keys=True, default=str), stream_id)
        return True, "bad arguments answered", True


def create_plugin():
    return AllCapsPlugin()
