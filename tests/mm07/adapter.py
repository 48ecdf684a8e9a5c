"""A platform adapter built on the real maim_message 0.7.x client (Socket.IO), driven by the tests.

Runs in .venv-mm07 (one environment cannot hold both wire versions). Protocol, one JSON object per line:
  stdin:  {"cmd": "send", "frame": {...}} | {"cmd": "echo", "echo": "<uid>", "actual_id": 1}
          | {"cmd": "custom", "name": "...", "content": {...}} | {"cmd": "stop"}
  stdout: {"event": "connected"} | {"event": "refused"} | {"event": "message", "data": {...}}
          | {"event": "sent", "ok": true} | {"event": "disconnected"}
Usage: adapter.py URL PLATFORM [TOKEN]
"""

import asyncio
import json
import logging
import sys

import maim_message
from maim_message import MessageClient

logging.basicConfig(level=logging.WARNING, stream=sys.stderr)


def emit(event: dict) -> None:
    sys.stdout.write(json.dumps(event, ensure_ascii=False) + "\n")
    sys.stdout.flush()


async def main(url: str, platform: str, token: str | None) -> None:
    assert maim_message.__version__.startswith("0.7"), maim_message.__version__
    client = MessageClient(mode="ws")

    async def on_message(message: dict) -> None:
        emit({"event": "message", "data": message})

    client.register_message_handler(on_message)
    await client.connect(url=url, platform=platform, token=token)
    connection = client.connection
    if not await connection.connect():
        emit({"event": "refused"})
        await client.stop()
        return

    @connection.sio.on("disconnect")
    async def _gone(*args) -> None:
        connection._connected = False
        emit({"event": "disconnected"})

    emit({"event": "connected", "version": maim_message.__version__})
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = await reader.readline()
        if not line:
            break
        cmd = json.loads(line)
        if cmd["cmd"] == "stop":
            break
        if cmd["cmd"] == "send":
            ok = await client.send_message(cmd["frame"])
        elif cmd["cmd"] == "echo":
            ok = await client.send_custom_message(
                "message_id_echo", {"type": "echo", "echo": cmd["echo"], "actual_id": cmd["actual_id"]}
            )
        else:
            ok = await client.send_custom_message(cmd["name"], cmd["content"])
        emit({"event": "sent", "ok": bool(ok)})
    connection.sio.reconnection = False
    await client.stop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))
