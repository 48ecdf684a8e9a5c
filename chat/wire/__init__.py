"""The maim_message wire format, both ways: inbound.py parses what adapters send, outbound.py builds
what we send to adapters (and to the browser chat page)."""
