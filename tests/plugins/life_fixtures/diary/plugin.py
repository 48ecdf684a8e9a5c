"""A test plugin (real maibot-plugin-sdk) with a tool offered to the life loop alone. It writes what it
does, with its runner's pid and parent pid, in diary.txt in its working directory (the runner's
runtime dir), so a test sees which process ran it and that it unloaded."""

import os
from pathlib import Path

from maibot_sdk import MaiBotPlugin, Tool
from maibot_sdk.types import ToolParameterInfo, ToolParamType

DIARY = Path("diary.txt")


def _write(*words: str) -> None:
    with DIARY.open("a", encoding="utf-8") as fh:
        fh.write(" ".join([*words, str(os.getpid()), str(os.getppid())]) + "\n")


class DiaryPlugin(MaiBotPlugin):
    async def on_load(self) -> None:
        _write("loaded")

    async def on_unload(self) -> None:
        _write("unloaded")

    async def on_config_update(self, scope, config_data, version) -> None:
        pass

    @Tool(
        "write_diary",
        description="Writes a line in the bot's diary",
        parameters=[ToolParameterInfo(name="line", param_type=ToolParamType.STRING, description="line", required=True)],
        life_loop="only",
    )
    async def write_diary(self, line: str, **kwargs):
        nickname = await self.ctx.config.get("bot.nickname", "someone")
        _write("note", line.replace(" ", "_"))
        return {"content": f"{nickname} noted: {line}"}


def create_plugin():
    return DiaryPlugin()
