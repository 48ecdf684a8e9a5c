"""The first-run set-up page of the single file: operator account, model (with a test call), bot nickname and
persona, adapter token. After it, the normal admin. When the page is open and what it asks for (always the
one-time code, attempts limited): core.setup.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from urllib.parse import urlsplit

from django import forms
from django.conf import settings
from django.contrib.auth import get_user_model, login
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.utils.translation import gettext_lazy as _
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from chat.agent import llm
from console.config_editor import read_config_file, toml_with_values
from core import deployment_env, hosts, reload, setup
from core.adapter_tokens import DEFAULT_PLATFORM
from core.config import BotConfig, LLMModel, get_config
from core.config.sections import known_zone

WRONG_CODE = _("This is not the code printed in the console.")
# How the QQ adapter is admitted (chat.gateway.auth): without a token from this machine only (the
# standalone MaiBot-Napcat-Adapter in its legacy mode never sends one), or with a token from anywhere
# (its API-Server mode, `enable_api_server = true`, sends it as `x-apikey`). A platform with a token is
# reachable with the token alone, so the two exclude each other for qq.
LOCAL, TOKEN = "local", "token"
ADAPTER_MODES = [
    (LOCAL, _("On this machine, without a token (the standalone NapCat adapter in legacy mode)")),
    (TOKEN, _("With a token, from this machine or another (the NapCat adapter in API-Server mode)")),
]


def locked_message(retry_after: int) -> str:
    """Why the code was not even compared, and the way round it (in the request's language)."""
    minutes = max(1, -(-retry_after // 60))
    return _(
        "Too many wrong codes: the set-up is locked for about %(minutes)s min. The code is printed in the "
        "console where maibot started; the operator account can also be made there with "
        "`maibot manage createsuperuser`, which closes this page."
    ) % {"minutes": minutes}


def _client(request: HttpRequest) -> str | None:
    # The address maibot.proxies decided (a trusted proxy's X-Forwarded-For, else the peer).
    return request.META.get("REMOTE_ADDR") or None


# The bot's fixed texts exist in these (bot.language; any BCP 47 tag can be written in the config).
BOT_LANGUAGES = [("zh", "中文"), ("en", "English")]
# Offered as the operator types (any IANA name is accepted).
COMMON_TIME_ZONES = [
    "Asia/Shanghai", "Asia/Hong_Kong", "Asia/Taipei", "Asia/Singapore", "Asia/Tokyo", "Asia/Seoul",
    "Europe/London", "Europe/Berlin", "America/New_York", "America/Los_Angeles", "Australia/Sydney", "UTC",
]  # fmt: skip


class SetupForm(forms.Form):
    # First: a wrong code is counted before anything else is looked at.
    code = forms.CharField(max_length=64, label=_("One-time code (printed in the console)"))
    username = forms.CharField(max_length=150, initial="admin", label=_("Operator user name"))
    password = forms.CharField(max_length=128, widget=forms.PasswordInput, label=_("Password"))
    password2 = forms.CharField(max_length=128, widget=forms.PasswordInput, label=_("Password again"))
    llm_base_url = forms.URLField(required=False, max_length=2048, label=_("Model API base URL"), assume_scheme="https")
    llm_api_key = forms.CharField(
        required=False, max_length=512, widget=forms.PasswordInput(render_value=True), label=_("API key")
    )
    llm_model = forms.CharField(required=False, max_length=256, label=_("Model name (empty: offline mode)"))
    nickname = forms.CharField(max_length=64, label=_("Bot nickname"))
    persona = forms.CharField(max_length=8000, widget=forms.Textarea(attrs={"rows": 3}), label=_("Persona"))
    # Empty (an older form): the config's own values stay.
    language = forms.ChoiceField(required=False, choices=BOT_LANGUAGES, label=_("The bot speaks"))
    time_zone = forms.CharField(
        required=False,
        max_length=64,
        widget=forms.TextInput(attrs={"list": "time-zones", "autocomplete": "off"}),
        label=_("The bot's time zone"),
        help_text=_(
            "An IANA name such as Asia/Shanghai: the times the bot and this console show, and what a "
            '"tomorrow at 8" means.'
        ),
    )
    adapter_mode = forms.ChoiceField(
        required=False,
        choices=ADAPTER_MODES,
        widget=forms.RadioSelect,
        label=_("How your QQ adapter connects"),
    )
    adapter_token = forms.CharField(required=False, max_length=256, label=_("Adapter token"))

    def __init__(self, *args, client: str | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.client = client
        self.locked_for = 0  # seconds, when the attempt was refused by the lock-out
        current = get_config().bot.language  # one written in the config stays a choice
        if current not in dict(BOT_LANGUAGES):
            self.fields["language"].choices = [*BOT_LANGUAGES, (current, current)]

    def clean_code(self) -> str:
        code = self.cleaned_data.get("code", "")
        check = setup.code_attempt(code, client=self.client)
        if check.retry_after:
            self.locked_for = check.retry_after
            raise ValidationError(locked_message(check.retry_after))
        if not check.ok:
            raise ValidationError(WRONG_CODE)
        return code

    def clean_username(self) -> str:
        name = self.cleaned_data["username"].strip()
        if get_user_model().objects.filter(username=name).exists():
            raise ValidationError(_("A user with this name exists already."))
        return name

    def clean_time_zone(self) -> str:
        zone = self.cleaned_data.get("time_zone", "").strip()
        try:
            return known_zone(zone)  # the config's own check, here with the field's message
        except ValueError:
            raise ValidationError(
                _("“%(zone)s” is no time zone this machine knows; write one such as Asia/Shanghai."),
                params={"zone": zone},
            ) from None

    def clean_adapter_token(self) -> str:
        token = self.cleaned_data["adapter_token"].strip()
        if token and ("," in token or any(c.isspace() for c in token)):
            raise ValidationError(_("One token, without commas or spaces."))
        return token

    def clean(self) -> dict:
        data = super().clean()
        # Without a choice (an older form), a token given means the token mode.
        mode = data.get("adapter_mode") or (TOKEN if data.get("adapter_token") else LOCAL)
        data["adapter_mode"] = mode
        if mode == LOCAL:
            data["adapter_token"] = ""  # a token would lock out the token-less adapter on this machine
        elif not data.get("adapter_token") and "adapter_token" not in self.errors:
            self.add_error("adapter_token", _("Give the token your adapter will send, or choose the first way."))
        if data.get("password") and data.get("password") != data.get("password2"):
            self.add_error("password2", _("The passwords differ."))
        elif data.get("password"):
            try:
                validate_password(data["password"])
            except ValidationError as exc:
                self.add_error("password", exc)
        if data.get("llm_model") and not data.get("llm_base_url"):
            self.add_error("llm_base_url", _("A model needs its API base URL."))
        return data


def _bot_config(data: dict):
    """The current config with the set-up's values, validated (ConfigError/ValidationError name the key)."""
    values = get_config().model_dump()
    values["bot"].update(nickname=data["nickname"], persona=data["persona"])
    values["bot"].update({key: data[key] for key in ("language", "time_zone") if data.get(key)})
    values["llm"].update(base_url=data.get("llm_base_url") or "", model=data.get("llm_model") or "")
    return BotConfig.model_validate(values)


def _apply_secrets(data: dict) -> None:
    key, token = data.get("llm_api_key") or "", data.get("adapter_token") or ""
    env_file = Path(settings.DATA_DIR) / deployment_env.FILE_NAME
    # The set-up's token is the NapCat adapter's: bound to qq, written so (a bare token means the same).
    tokens = f"{DEFAULT_PLATFORM}:{token}" if token else ""
    deployment_env.update(env_file, {"OPENAI_API_KEY": key, "MAIBOT_ADAPTER_TOKENS": tokens})
    # This process applies them now (what the server's environment sets still wins); every other process
    # applies the file by itself on its next use of a key or token (deployment_env.refresh).
    deployment_env.refresh(env_file)


# Not CSRF-checked: every POST must carry the one-time code, which a cross-site page cannot know, and
# while the set-up is pending no session exists to ride on. (Django's check would also refuse the first
# visit through a TLS proxy this server does not trust yet: core.hosts.)
@csrf_exempt
@never_cache
def setup_view(request: HttpRequest) -> HttpResponse:
    if not setup.setup_pending():
        return redirect("/admin/")
    status = 200
    if request.method == "POST":
        form = SetupForm(request.POST, client=_client(request))
        if form.is_valid():
            data = form.cleaned_data
            try:
                cfg = _bot_config(data)
            except (ValueError, ValidationError) as exc:
                form.add_error(None, _("Invalid bot settings: %(error)s") % {"error": exc})
            else:
                user = _finish(data, cfg, request)
                if user is None:  # another request finished it meanwhile
                    return redirect("/admin/")
                login(request, user, backend="django.contrib.auth.backends.ModelBackend")
                return redirect("home")
        elif form.locked_for:
            status = 429
        elif "code" in form.errors:
            status = 403
    else:
        cfg = get_config()
        form = SetupForm(
            initial={
                "nickname": cfg.bot.nickname,
                "persona": cfg.bot.persona,
                "language": cfg.bot.language,
                "time_zone": cfg.tzinfo.key,
                "llm_base_url": cfg.llm.base_url,
                "llm_model": cfg.llm.model,
                "adapter_mode": LOCAL,
                "adapter_token": secrets.token_urlsafe(24),
            },
        )
    context = {"form": form, "time_zones": COMMON_TIME_ZONES, **adapter_snippets(request, form)}
    return TemplateResponse(request, "setup/setup.html", context, status=status)


def adapter_snippets(request: HttpRequest, form: SetupForm) -> dict:
    """What to write in the NapCat adapter's config.toml (`[maibot_server]`, MaiBot-Napcat-Adapter 0.7's
    keys) for each way: on this machine, this server's own port; with a token, the address the operator's
    browser used (through a TLS proxy: wss)."""
    scheme = "wss" if request.is_secure() else "ws"
    token = form["adapter_token"].value() or "<token>"
    return {
        "snippet_local": f'[maibot_server]\nhost = "127.0.0.1"\nport = {settings.PORT}',
        "snippet_token": "[maibot_server]\nenable_api_server = true\n"
        f'base_url = "{scheme}://{request.get_host()}/ws"\napi_key = "{token}"',
    }


def _finish(data: dict, cfg, request: HttpRequest):
    """Save the settings and create the operator, once: under the set-up's lock, and only while it is
    still pending (None when another request or `createsuperuser` got there first)."""
    with setup.exclusive():
        if not setup.setup_pending():
            return None
        text, _file_cfg, _file_error = read_config_file()
        reload.config_save_text(text=toml_with_values(text, cfg), source="set-up page")
        _apply_secrets(data)
        hosts.remember_setup_host(request, Path(settings.DATA_DIR) / deployment_env.FILE_NAME)
        with transaction.atomic():
            user = get_user_model().objects.create_superuser(
                username=data["username"], email="", password=data["password"]
            )
        # Last: until here a failure leaves the set-up open to be done again.
        setup.close()
    hosts.close_first_run()
    return user


@csrf_exempt  # the one-time code is asked for, as on the form
@never_cache
@require_POST
def test_model_view(request: HttpRequest) -> JsonResponse:
    """One tiny call to the model the form names (not saved yet), with the code. The answer says only
    how it went (OK, or the HTTP status / kind of failure), how long it took and whether the model
    called the offered tool: never what the remote end sent, so it cannot read another service."""
    if not setup.setup_pending():
        return JsonResponse({"ok": False, "error": _("The set-up is done.")}, status=404)
    check = setup.code_attempt(request.POST.get("code", ""), client=_client(request))
    if check.retry_after:
        return JsonResponse({"ok": False, "error": locked_message(check.retry_after)}, status=429)
    if not check.ok:
        return JsonResponse({"ok": False, "error": WRONG_CODE}, status=403)
    base_url = request.POST.get("llm_base_url", "").strip()[:2048]
    model = request.POST.get("llm_model", "").strip()[:256]
    if not base_url or not model:
        return JsonResponse({"ok": False, "error": _("Fill in the base URL and the model name first.")}, status=400)
    if urlsplit(base_url).scheme not in ("http", "https"):
        return JsonResponse({"ok": False, "error": _("The base URL must start with http:// or https://.")}, status=400)
    result = llm.model_test(
        LLMModel(
            name="default",
            base_url=base_url,
            api_key=request.POST.get("llm_api_key", "")[:512] or "not-needed",
            model=model,
            price_input_per_1m=0.0,
            price_output_per_1m=0.0,
            timeout=llm.MODEL_TEST_TIMEOUT,
            max_concurrent=0,
        )
    )
    return JsonResponse(
        {
            "ok": result.ok,
            "latency_ms": result.latency_ms,
            "outcome": result.outcome,
            "tool_calling": result.tool_calling,
        }
    )
