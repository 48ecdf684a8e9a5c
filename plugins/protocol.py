"""The messages between the plugin host and a plugin runner, as typed models: what each side may send
(plugins.ipc carries them as frames). Each frame is checked where it is read (`from_runner`,
`from_host`): one that is not exactly one of these messages raises ProtocolError saying what is wrong,
and is never acted on. A runner is untrusted (plugin code runs in it and can write to its pipe): the
host kills a runner that sends a malformed frame (plugins.supervisor), and the plugin is restarted as
after a crash, with the reason on its record. Imported by the runner: nothing here imports Django.

Host → runner: load, invoke, unload, cancel, and the reply to a runner's call.
Runner → host: hello, the reply to a request (or `cancelled`), and call (a capability call).
A reply's `result` and a request's `args` are whatever JSON carries (tuples too, plugins.ipc);
`LoadResult` is the result of a load request, checked by the host before it uses it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError


class ProtocolError(ValueError):
    """A frame that is not a message of the protocol (or a load result that is not one)."""


# An exception crossing the pipe: {"type": its class name, "message": its text}.
ErrorInfo = dict[str, str]


class Message(BaseModel):
    """One message; `wire()` is the dict plugins.ipc encodes (no copy of its values)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    def wire(self) -> dict[str, Any]:
        return dict(self)


class Load(Message):
    type: Literal["load"] = "load"
    id: int
    config_text: str | None  # the plugin's config.toml, None when it has none (the runner makes the default)


class Invoke(Message):
    type: Literal["invoke"] = "invoke"
    id: int
    component: str
    handler: str
    args: dict[str, Any]


class Unload(Message):
    type: Literal["unload"] = "unload"
    id: int


class Cancel(Message):
    type: Literal["cancel"] = "cancel"
    id: int


class Reply(Message):
    """The answer to a request (either way): `result` when ok, else `error`."""

    type: Literal["reply"] = "reply"
    id: int
    ok: bool
    result: Any = None
    error: ErrorInfo | None = None


class Hello(Message):
    type: Literal["hello"] = "hello"
    pid: int


class Cancelled(Message):
    """The runner cancelled the request `id` (as the host asked, or it was not running)."""

    type: Literal["cancelled"] = "cancelled"
    id: int


class Call(Message):
    """A call from the plugin to the host (`rpc_call`): `method` with `payload`."""

    type: Literal["call"] = "call"
    id: int
    method: str
    payload: dict[str, Any]
    timeout_ms: Any = None  # as the plugin gave it; the capability checks it (an error answer, not a refusal)


HostMessage = Annotated[Load | Invoke | Unload | Cancel | Reply, Field(discriminator="type")]
RunnerMessage = Annotated[Hello | Reply | Cancelled | Call, Field(discriminator="type")]
Request = Load | Invoke | Unload


class Component(BaseModel):
    """A component the plugin declares (the SDK's declaration: `metadata` as it gives it)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str
    type: str
    metadata: dict[str, Any]


class LoadResult(BaseModel):
    """What loading the plugin in its runner gave."""

    model_config = ConfigDict(extra="forbid", strict=True)

    warnings: list[str]
    config_text: str  # the config the plugin loaded with (the generated default when it had none)
    default_config: bool  # config_text is the generated default: the host writes it
    config: dict[str, Any]
    allow_hot_reload: bool
    disabled: bool
    components: list[Component]
    # What component.get_plugin_config_schema answers (the SDK's get_default_config and
    # get_webui_config_schema; {} when the plugin's SDK gives none).
    default_values: dict[str, Any] = {}
    config_schema: dict[str, Any] = {}


_from_runner: TypeAdapter[Hello | Reply | Cancelled | Call] = TypeAdapter(RunnerMessage)
_from_host: TypeAdapter[Load | Invoke | Unload | Cancel | Reply] = TypeAdapter(HostMessage)


def _refused(what: str, exc: ValidationError) -> ProtocolError:
    first = exc.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(p) for p in first["loc"]) or "the frame"
    return ProtocolError(f"malformed {what}: {where}: {first['msg']} ({exc.error_count()} error(s))")


def from_runner(message: dict[str, Any]) -> Hello | Reply | Cancelled | Call:
    """A frame a runner sent, as its message; ProtocolError when it is not one."""
    try:
        return _from_runner.validate_python(message)
    except ValidationError as exc:
        raise _refused("frame from the runner", exc) from None


def from_host(message: dict[str, Any]) -> Load | Invoke | Unload | Cancel | Reply:
    """A frame the host sent, as its message; ProtocolError when it is not one."""
    try:
        return _from_host.validate_python(message)
    except ValidationError as exc:
        raise _refused("frame from the host", exc) from None


def load_result(result: Any) -> LoadResult:
    """A load request's result; ProtocolError when it is not a LoadResult."""
    try:
        return LoadResult.model_validate(result)
    except ValidationError as exc:
        raise _refused("load result", exc) from None
