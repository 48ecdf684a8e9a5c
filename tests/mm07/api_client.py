"""An adapter in maim_message's API-Server mode, driven by the tests: the real WebSocketClient with
x-apikey / x-platform, wired as MaiBot-Napcat-Adapter 0.7.0 wires it (`enable_api_server = true`, its
src/mmc_com_layer.py): messages go out as MessageConverter.to_api_receive(MessageBase, api_key, platform),
what arrives is turned back with MessageConverter.from_api_send(...).to_dict() (what its send handler
reads), receipts go out with send_custom_message("message_id_echo", ...).

Runs in .venv-mm07 (0.7.x: Socket.IO) or .venv (0.6.8: the same packages over a plain websocket); the
"connected" event names the version. Protocol, one JSON object per line:
  stdin:  {"cmd": "send", "frame": {...MessageBase dict...}} | {"cmd": "echo", "echo": "<uid>", "actual_id": 1}
          | {"cmd": "custom", "name": "...", "content": {...}} | {"cmd": "raw", "frame": {...}} | {"cmd": "stop"}
  stdout: {"event": "connected"} | {"event": "refused", "error": "..."}
          | {"event": "message", "data": {...legacy MessageBase dict...}, "meta": {...}}
          | {"event": "sent", "ok": true} | {"event": "disconnected"}
Usage: api_client.py URL PLATFORM API_KEY
"""

import asyncio
import json
import logging
import os
import sys

import maim_message
from maim_message import MessageBase, MessageConverter
from maim_message.client import WebSocketClient, create_client_config

logging.basicConfig(level=logging.WARNING, stream=sys.stderr)


def emit(event: dict) -> None:
    sys.stdout.write(json.dumps(event, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def leave() -> None:
    """Exit once the client has stopped: 0.6.8's client leaves its log-queue reader blocked in a thread
    (asyncio.to_thread(queue.get)) after stop(), and asyncio.run() would wait for that thread forever
    when it shuts its default executor down."""
    sys.stdout.flush()
    os._exit(0)


async def main(url: str, platform: str, api_key: str) -> None:
    async def on_message(message, metadata) -> None:
        legacy = MessageConverter.from_api_send(message)
        emit({"event": "message", "data": legacy.to_dict(), "meta": metadata})

    client = WebSocketClient(create_client_config(url=url, api_key=api_key, platform=platform, on_message=on_message))
    await client.start()
    connecting = asyncio.create_task(client.connect())
    # connect() polls for ten seconds; a refusal shows at once as the driver's disconnect event.
    while not client.is_connected() and client.get_last_error() is None and not connecting.done():
        await asyncio.sleep(0.02)
    if not client.is_connected():
        emit({"event": "refused", "error": client.get_last_error()})
        connecting.cancel()
        await asyncio.gather(connecting, return_exceptions=True)
        await client.stop()
        leave()
    await connecting
    emit({"event": "connected", "version": maim_message.__version__, "uuid": client.get_connection_uuid()})

    original = client._handle_disconnect_event

    async def gone(event) -> None:
        await original(event)
        emit({"event": "disconnected"})

    client._handle_disconnect_event = gone

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
            legacy = MessageBase.from_dict(cmd["frame"])
            api_message = MessageConverter.to_api_receive(
                message=legacy, api_key=api_key, platform=legacy.message_info.platform or platform
            )
            ok = await client.send_message(api_message)
        elif cmd["cmd"] == "echo":
            ok = await client.send_custom_message(
                "message_id_echo", {"type": "echo", "echo": cmd["echo"], "actual_id": cmd["actual_id"]}
            )
        elif cmd["cmd"] == "raw":
            ok = await client.network_driver.send_message(client.get_connection_uuid(), cmd["frame"])
        else:
            ok = await client.send_custom_message(cmd["name"], cmd["content"])
        emit({"event": "sent", "ok": bool(ok)})
    await client.stop()
    leave()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
    leave()
