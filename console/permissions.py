"""Permission names in the operator's language wherever the admin offers permissions to choose (a user's
and a group's form). Django stores each permission's name as an English row (auth_permission.name, written
when the model was migrated) and shows that row as written; this module names a permission at render time
instead: Django's four default ones ("Can add …") from the model's own translated name, the project's
custom ones through the catalog (their names are marked with gettext_noop where they are declared)."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.utils.translation import gettext, gettext_lazy

DEFAULT_ACTIONS = {
    "add": gettext_lazy("Can add %(name)s"),
    "change": gettext_lazy("Can change %(name)s"),
    "delete": gettext_lazy("Can delete %(name)s"),
    "view": gettext_lazy("Can view %(name)s"),
}


def permission_name(permission: Permission) -> str:
    """The permission's name in the active language (the stored English name when nothing knows it)."""
    model = permission.content_type.model_class()
    action, _, model_name = permission.codename.partition("_")
    meta = model._meta if model is not None else None
    if meta and action in DEFAULT_ACTIONS and action in meta.default_permissions and model_name == meta.model_name:
        return DEFAULT_ACTIONS[action] % {"name": meta.verbose_name}
    return gettext(permission.name)


def permission_label(permission: Permission) -> str:
    """What a permission chooser lists: app | model | name, each in the active language."""
    return f"{permission.content_type} | {permission_name(permission)}"


class PermissionLabelsMixin:
    """A ModelAdmin whose permission fields list each permission by `permission_label`."""

    def formfield_for_manytomany(self, db_field, request, **kwargs):
        field = super().formfield_for_manytomany(db_field, request, **kwargs)
        if field is not None and db_field.remote_field.model is Permission:
            field.label_from_instance = permission_label
        return field


def label_permissions_of_users_and_groups() -> None:
    """Re-register the user and group admins (whatever classes are registered) with translated permissions."""
    for model in (get_user_model(), Group):
        if not admin.site.is_registered(model):
            continue
        current = type(admin.site.get_model_admin(model))
        admin.site.unregister(model)
        admin.site.register(model, type(current.__name__, (PermissionLabelsMixin, current), {}))
