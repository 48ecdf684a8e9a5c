"""A test plugin written against the real maibot-plugin-sdk that sees and answers frames far above a
pipe's 64 KiB: it fingerprints (length, SHA-256) each message its hook and its command see and says
so in the chat, answers a tool with a result of the size asked, renders a large page, reads a chat's
long messages back, and takes a config.toml of any size. What it saw is read back through its APIs."""

import hashlib

from maibot_sdk import API, Command, Field, HookHandler, MaiBotPlugin, PluginConfigBase, Tool
from maibot_sdk.types import HookOrder, ToolParameterInfo, ToolParamType

# A noisy canvas: its PNG cannot compress below hundreds of KiB.
NOISE_PAGE = """<html><body style="margin:0"><canvas id="c" width="%d" height="%d"></canvas><script>
const c = document.getElementById("c"), g = c.getContext("2d"), img = g.createImageData(c.width, c.height);
for (let i = 0; i < img.data.length; i++) img.data[i] = Math.random() * 256;
for (let i = 3; i < img.data.length; i += 4) img.data[i] = 255;
g.putImageData(img, 0, 0);
</script></body></html>"""


def fingerprint(text: str) -> dict:
    return {"length": len(text), "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}


def filler(size: int) -> str:
    """`size` characters of text mixing ASCII and multi-byte characters."""
    unit = "frame 帧 🧩 "
    return (unit * (size // len(unit) + 1))[:size]


class PluginSection(PluginConfigBase):
    config_version: str = Field(default="1.0.0", description="Config version")
    enabled: bool = Field(default=True, description="Whether the plugin is enabled")


class NotesSection(PluginConfigBase):
    lines: list[str] = Field(default_factory=list, description="Any number of lines")


class BigFramesConfig(PluginConfigBase):
    plugin: PluginSection = Field(default_factory=PluginSection)
    notes: NotesSection = Field(default_factory=NotesSection)


class BigFramesPlugin(MaiBotPlugin):
    config_model = BigFramesConfig

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict] = []

    async def on_load(self) -> None:
        pass

    async def on_unload(self) -> None:
        pass

    async def on_config_update(self, scope, config_data, version) -> None:
        pass

    @HookHandler("chat.receive.before_process", name="fingerprint_hook", order=HookOrder.EARLY)
    async def fingerprint_hook(self, message=None, **kwargs):
        self.seen.append({"where": "hook", **fingerprint(message["processed_plain_text"])})
        return {"action": "continue"}

    @Command("fingerprint", description="Fingerprints the text after the command", pattern=r"^/fingerprint ")
    async def fingerprint_command(self, text: str = "", stream_id: str = "", **kwargs):
        seen = {"where": "command", **fingerprint(text.removeprefix("/fingerprint "))}
        self.seen.append(seen)
        self.ctx.logger.info("fingerprint %s %s", seen["length"], seen["sha256"])
        await self.ctx.send.text(f"fingerprint {seen['length']} {seen['sha256']}", stream_id)
        return True, "fingerprinted", True

    @Tool(
        "big_answer",
        description="Answers with as many characters as asked",
        parameters=[ToolParameterInfo(name="size", param_type=ToolParamType.INTEGER, description="n", required=True)],
    )
    async def big_answer(self, size: int = 0, **kwargs):
        body = filler(size)
        return {"content": body, **fingerprint(body)}

    @API("seen", description="What the hook and the command saw", public=True)
    async def api_seen(self, **kwargs):
        return list(self.seen)

    @API("notes", description="A fingerprint of the config's notes", public=True)
    async def api_notes(self, **kwargs):
        return {"count": len(self.config.notes.lines), **fingerprint("\n".join(self.config.notes.lines))}

    @API("render_noise", description="Renders a noisy canvas and hands the PNG back", public=True)
    async def api_render_noise(self, side: int = 400, **kwargs):
        png = await self.ctx.render.html2png(NOISE_PAGE % (side, side), selector="#c", device_scale_factor=1)
        return {"image_base64": png["image_base64"], "width": png["width"], "height": png["height"]}

    @API("recent", description="A chat's recent messages, fingerprinted (or the error)", public=True)
    async def api_recent(self, stream_id: str = "", **kwargs):
        try:
            messages = await self.ctx.message.get_recent(stream_id, limit=5)
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        return {"messages": [fingerprint(m["processed_plain_text"]) for m in messages]}


def create_plugin():
    return BigFramesPlugin()
