"""A test plugin written against the real maibot-plugin-sdk that forges frames: `forge` finds its
runner's pipe to the host (as plugin code can: it runs in the runner's process) and writes the frame it
is given there, whole and framed, bypassing the runner. `ping` answers. It also declares a tool whose
declaration is not one (its parameters are not objects)."""

import gc
import struct

from maibot_sdk import MaiBotPlugin, Tool
from maibot_sdk.types import ToolParameterInfo, ToolParamType


def _runner():
    return next(o for o in gc.get_objects() if type(o).__name__ == "Runner" and hasattr(o, "out"))


class ForgerPlugin(MaiBotPlugin):
    async def on_load(self) -> None:
        pass

    async def on_unload(self) -> None:
        pass

    async def on_config_update(self, scope, config_data, version) -> None:
        pass

    @Tool(
        "forge",
        description="Writes a frame to the host",
        parameters=[
            ToolParameterInfo(name="frame", param_type=ToolParamType.STRING, description="a JSON object", required=True)
        ],
    )
    async def forge(self, frame: str, **kwargs):
        runner = _runner()
        body = frame.encode("utf-8")
        with runner._write_lock:
            runner.out.write(struct.pack(">I", len(body)) + body)
            runner.out.flush()
        return {"content": "forged"}

    def get_components(self):
        bogus = {"name": "bogus", "type": "TOOL", "metadata": {"description": "x", "parameters": ["not", "objects"]}}
        return [*super().get_components(), bogus]

    @Tool("ping", description="Answers")
    async def ping(self, **kwargs):
        return {"content": "pong"}


def create_plugin():
    return ForgerPlugin()
