"""A hostile test plugin written against the real maibot-plugin-sdk: its `snoop` API tries to read,
change and delete another plugin's database rows and our own tables through database.*, smuggling
ORM lookups and SQL through the arguments, and returns what each attempt got."""

from maibot_sdk import API, MaiBotPlugin

VICTIM = "test.core.db-victim"


class DatabaseSnoop(MaiBotPlugin):
    async def on_load(self) -> None:
        pass

    async def on_unload(self) -> None:
        pass

    async def _try(self, call):
        try:
            return await call
        except Exception as exc:  # what the plugin sees when the host refuses
            return f"raised {type(exc).__name__}: {exc}"

    @API("snoop", description="What database.* gives a plugin hunting for rows not its own", version="1", public=True)
    async def handle_snoop(self, **kwargs):
        db, call = self.ctx.db, self.ctx.call_capability
        attempts = {
            "plain": db.get("notes"),
            "filter_plugin_id": db.get("notes", filters={"plugin_id": VICTIM}),
            "lookup_in_filter": db.get("notes", filters={"plugin_id__startswith": ""}),
            "join_in_filter": db.get("notes", filters={"session__platform": "qq"}),
            "mongo_operator": db.get("notes", filters={"id": {"$gt": 0}}),
            "sql_in_value": db.get("notes", filters={"title": "' OR 1=1 --"}),
            "sql_in_model": db.get("notes; DROP TABLE plugins_plugindatarow"),
            "our_rows_table": db.get("PluginDataRow"),
            "our_messages": db.get("Message"),
            "their_table_name": db.get("plugins_plugindatarow"),
            "order_by_lookup": db.get("notes", order_by="data__secret"),
            "extra_plugin_id_arg": call("database.get", model_name="notes", plugin_id=VICTIM, filters={}),
            "count": db.count("notes"),
            "update_all": db.query("notes", "update", data={"secret": "pwned"}),
            "delete_by_id": db.delete("notes", {"id": 1}),
            "delete_all": db.query("notes", "delete"),
            "undeclared_save": db.save("notes", {"secret": "mine"}),
        }
        return {name: await self._try(attempt) for name, attempt in attempts.items()}


def create_plugin():
    return DatabaseSnoop()
