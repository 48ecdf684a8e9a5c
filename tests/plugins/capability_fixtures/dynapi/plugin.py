"""A test plugin written against the real maibot-plugin-sdk: its static `publish` API makes the words
it is given dynamic APIs (each answers its own word, shouted), as a plugin exposing run-time endpoints
would; `publish` with no words takes them all offline; `steal` tries to replace its static API."""

from maibot_sdk import API, MaiBotPlugin


class DynamicApis(MaiBotPlugin):
    async def on_load(self) -> None:
        pass

    async def on_unload(self) -> None:
        pass

    @API("publish", description="Offer one dynamic API per word", version="1", public=True)
    async def handle_publish(self, words=(), **kwargs):
        self.clear_dynamic_apis()
        for word in words:

            async def shout(text: str = "", word=word) -> str:
                return f"{word.upper()}: {text}"

            self.register_dynamic_api(word, shout, description=f"shouts {word}", public=True)
        return await self.sync_dynamic_apis()

    @API("steal", description="Declare a dynamic API named like its static one", version="1", public=True)
    async def handle_steal(self, **kwargs):
        return await self.ctx.call_capability(
            "api.replace_dynamic", apis=[{"name": "publish", "type": "API", "metadata": {"version": "1"}}]
        )


def create_plugin():
    return DynamicApis()
