"""The Plugins page's words for what the host keeps as identifiers (a plugin's state, its runner's, a
component's kind, a limit's name, an operator action) and its sandbox, in the operator's language. A value
no label knows is shown as written."""

from __future__ import annotations

from collections.abc import Callable

from django import template
from django.utils.translation import gettext, pgettext_lazy

from plugins import sandbox
from plugins.records import PluginRecord, PluginState

register = template.Library()

STATES = {
    PluginState.LOADED: pgettext_lazy("plugin state", "loaded"),
    PluginState.REFUSED: pgettext_lazy("plugin state", "refused"),
    PluginState.FAILED: pgettext_lazy("plugin state", "failed"),
    PluginState.DISABLED: pgettext_lazy("plugin state", "disabled"),
    PluginState.REMOVED: pgettext_lazy("plugin state", "removed"),
}
# PluginRecord.runner_state (plugins.runners, plugins.reloading, plugins.host).
RUNNER_STATES = {
    "running": pgettext_lazy("plugin runner", "running"),
    "restarting": pgettext_lazy("plugin runner", "restarting"),
    "crashed": pgettext_lazy("plugin runner", "crashed"),
    "stopped": pgettext_lazy("plugin runner", "stopped"),
}
# The SDK's component types (ComponentInfo.kind); "API" is a name in both languages.
COMPONENT_KINDS = {
    "ACTION": pgettext_lazy("plugin component", "ACTION"),
    "COMMAND": pgettext_lazy("plugin component", "COMMAND"),
    "TOOL": pgettext_lazy("plugin component", "TOOL"),
    "REPLY_EXTENSION": pgettext_lazy("plugin component", "REPLY_EXTENSION"),
    "EVENT_HANDLER": pgettext_lazy("plugin component", "EVENT_HANDLER"),
    "HOOK_HANDLER": pgettext_lazy("plugin component", "HOOK_HANDLER"),
    "HOME_CARD": pgettext_lazy("plugin component", "HOME_CARD"),
    "MESSAGE_GATEWAY": pgettext_lazy("plugin component", "MESSAGE_GATEWAY"),
}
# The kinds of PluginRecord.refusals: the limit that refused the plugin something.
LIMITS = {
    "sends": pgettext_lazy("plugin limit", "sends"),
    "media": pgettext_lazy("plugin limit", "media"),
    "cpu": pgettext_lazy("plugin limit", "cpu"),
    "memory": pgettext_lazy("plugin limit", "memory"),
    "database": pgettext_lazy("plugin limit", "database"),
}
# The operator actions (plugins.views.ACTIONS): the button's caption; its value and URL stay the action.
ACTIONS = {
    "enable": pgettext_lazy("plugin action", "enable"),
    "disable": pgettext_lazy("plugin action", "disable"),
    "reload": pgettext_lazy("plugin action", "reload"),
    "install-deps": pgettext_lazy("plugin action", "install-deps"),
}


def _label(labels: dict[str, str]) -> Callable[[str], str]:
    return lambda value: labels.get(value, value)


# {{ record.state|plugin_state }}, {{ record.runner_state|runner_state }}, … : the value's label.
for _name, _labels in {
    "plugin_state": STATES,
    "runner_state": RUNNER_STATES,
    "component_kind": COMPONENT_KINDS,
    "limit_kind": LIMITS,
    "plugin_action": ACTIONS,
}.items():
    register.filter(_name, _label(_labels))


@register.filter
def plugin_sandbox(record: PluginRecord) -> str:
    """How the record's runner is contained (as its record says it), in the operator's language."""
    if not record.sandbox or record.limits is None:
        return record.sandbox
    return sandbox.describe(record.plugin_id, record.limits.network, translate=gettext)
