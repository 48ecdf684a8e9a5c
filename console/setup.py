"""The first-run set-up page of the single file: operator account, model (with a test call), bot nickname and
persona, adapter token. After it, the normal admin. Who may open it and when: maibot.setup.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from django import forms
from django.conf import settings
from django.contrib.auth import get_user_model, login
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden, JsonResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from chat.agent import llm
from console.config_editor import read_config_file, toml_with_values
from maibot import deployment_env, reload
from maibot.adapter_tokens import DEFAULT_PLATFORM, parse_adapter_tokens
from maibot.config import BotConfig, LLMModel, get_config
from maibot.setup import code_ok, code_path, from_loopback, setup_pending


class SetupForm(forms.Form):
    code = forms.CharField(required=False, max_length=64, label="One-time code (printed in the console)")
    username = forms.CharField(max_length=150, initial="admin", label="Operator user name")
    password = forms.CharField(max_length=128, widget=forms.PasswordInput, label="Password")
    password2 = forms.CharField(max_length=128, widget=forms.PasswordInput, label="Password again")
    llm_base_url = forms.URLField(required=False, max_length=2048, label="Model API base URL", assume_scheme="https")
    llm_api_key = forms.CharField(
        required=False, max_length=512, widget=forms.PasswordInput(render_value=True), label="API key"
    )
    llm_model = forms.CharField(required=False, max_length=256, label="Model name (empty: offline mode)")
    nickname = forms.CharField(max_length=64, label="Bot nickname")
    persona = forms.CharField(max_length=8000, widget=forms.Textarea(attrs={"rows": 3}), label="Persona")
    adapter_token = forms.CharField(
        required=False, max_length=256, label="Adapter token (empty: only loopback adapters)"
    )

    def __init__(self, *args, need_code: bool, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.need_code = need_code
        if not need_code:
            del self.fields["code"]

    def clean_code(self) -> str:
        code = self.cleaned_data.get("code", "")
        if not code_ok(code):
            raise ValidationError("This is not the code printed in the console.")
        return code

    def clean_username(self) -> str:
        name = self.cleaned_data["username"].strip()
        if get_user_model().objects.filter(username=name).exists():
            raise ValidationError("A user with this name exists already.")
        return name

    def clean_adapter_token(self) -> str:
        token = self.cleaned_data["adapter_token"].strip()
        if token and ("," in token or any(c.isspace() for c in token)):
            raise ValidationError("One token, without commas or spaces.")
        return token

    def clean(self) -> dict:
        data = super().clean()
        if data.get("password") and data.get("password") != data.get("password2"):
            self.add_error("password2", "The passwords differ.")
        elif data.get("password"):
            try:
                validate_password(data["password"])
            except ValidationError as exc:
                self.add_error("password", exc)
        if data.get("llm_model") and not data.get("llm_base_url"):
            self.add_error("llm_base_url", "A model needs its API base URL.")
        return data


def _bot_config(data: dict):
    """The current config with the set-up's values, validated (ConfigError/ValidationError name the key)."""
    values = get_config().model_dump()
    values["bot"].update(nickname=data["nickname"], persona=data["persona"])
    values["llm"].update(base_url=data.get("llm_base_url") or "", model=data.get("llm_model") or "")
    return BotConfig.model_validate(values)


def _apply_secrets(data: dict) -> None:
    key, token = data.get("llm_api_key") or "", data.get("adapter_token") or ""
    env_file = Path(settings.DATA_DIR) / deployment_env.FILE_NAME
    # The set-up's token is the NapCat adapter's: bound to qq, written so (a bare token means the same).
    tokens = f"{DEFAULT_PLATFORM}:{token}" if token else ""
    deployment_env.update(env_file, {"OPENAI_API_KEY": key, "MAIBOT_ADAPTER_TOKENS": tokens})
    # This process applies them now; `serve` restarts the cluster for the file's change.
    if key:
        os.environ.setdefault("OPENAI_API_KEY", key)
    if token and not settings.MAIBOT_ADAPTER_TOKENS:
        settings.MAIBOT_ADAPTER_TOKENS = parse_adapter_tokens(tokens, name="MAIBOT_ADAPTER_TOKENS")


def _allowed(request: HttpRequest, code: str) -> bool:
    return from_loopback(request) or code_ok(code)


@never_cache
def setup_view(request: HttpRequest) -> HttpResponse:
    if not setup_pending():
        return redirect("/admin/")
    need_code = not from_loopback(request)
    if request.method == "POST":
        form = SetupForm(request.POST, need_code=need_code)
        if form.is_valid():
            data = form.cleaned_data
            try:
                cfg = _bot_config(data)
            except (ValueError, ValidationError) as exc:
                form.add_error(None, f"Invalid bot settings: {exc}")
            else:
                user = _finish(request, data, cfg)
                login(request, user, backend="django.contrib.auth.backends.ModelBackend")
                return redirect("/admin/")
    else:
        cfg = get_config()
        form = SetupForm(
            need_code=need_code,
            initial={
                "nickname": cfg.bot.nickname,
                "persona": cfg.bot.persona,
                "llm_base_url": cfg.llm.base_url,
                "llm_model": cfg.llm.model,
                "adapter_token": secrets.token_urlsafe(24),
            },
        )
    return TemplateResponse(request, "setup/setup.html", {"form": form, "need_code": need_code})


def _finish(request: HttpRequest, data: dict, cfg):
    text, _, _ = read_config_file()
    reload.config_save_text(text=toml_with_values(text, cfg), source="set-up page")
    _apply_secrets(data)
    with transaction.atomic():
        user = get_user_model().objects.create_superuser(username=data["username"], email="", password=data["password"])
    # Last: until here a failure leaves the set-up open to be done again.
    code_path().unlink(missing_ok=True)
    return user


@never_cache
@require_POST
def test_model_view(request: HttpRequest) -> JsonResponse | HttpResponse:
    """One tiny call to the model the form names (not saved yet): its answer and latency."""
    if not setup_pending() or not _allowed(request, request.POST.get("code", "")):
        return HttpResponseForbidden("The set-up is done, or the one-time code is wrong.")
    base_url = request.POST.get("llm_base_url", "").strip()[:2048]
    model = request.POST.get("llm_model", "").strip()[:256]
    if not base_url or not model:
        return JsonResponse({"ok": False, "error": "Fill in the base URL and the model name first."}, status=400)
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
        {"ok": result.ok, "latency_ms": result.latency_ms, "answer": result.answer, "error": result.error}
    )
