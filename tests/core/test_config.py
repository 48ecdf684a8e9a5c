"""The bot configuration: created on first run, validated, and an invalid file stops start-up."""

import subprocess
import sys

import pytest
from pydantic import BaseModel

from core.config import BotConfig, ConfigError, load_config, parse_config
from tests.conftest import ROOT


def test_first_run_creates_the_file_from_the_template(tmp_path):
    path = tmp_path / "bot_config.toml"
    cfg = load_config(path)
    assert path.exists() and "# Who the bot is." in path.read_text()
    assert cfg == BotConfig()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[bot]\ntime_zone = "Mars/Olympus"\n', "bot.time_zone: Value error, unknown time zone 'Mars/Olympus'"),
        ("[scheduling]\nmax_pending_per_session = 0\n", "scheduling.max_pending_per_session: Input should be greater"),
        ('[llm]\ntimeout = "soon"\n', "llm.timeout: Input should be a valid number"),
        ("[chat]\ntalk_frequncy = 0.2\n", "chat.talk_frequncy: unknown key"),
        ("[bot\nnickname = 1\n", "not valid TOML"),
    ],
)
def test_errors_name_the_key_and_the_problem(text, expected):
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert expected in str(info.value)


def test_chinese_values_round_trip():
    cfg = parse_config('[bot]\nnickname = "小麦"\npersona = "你是小麦。"\n')
    assert cfg.bot.nickname == "小麦"


@pytest.mark.live  # a real manage.py process
def test_an_invalid_file_stops_start_up_with_the_message(tmp_path):
    (tmp_path / "bot_config.toml").write_text('[bot]\ntime_zone = "Nowhere/Land"\n')
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "MAIBOT_DATA_DIR": str(tmp_path), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    # One line naming the file and the key, no traceback before it.
    assert result.stderr.splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith(f"Invalid bot configuration: {tmp_path / 'bot_config.toml'}: bot.time_zone")
    assert "Nowhere/Land" in result.stderr and "Traceback" not in result.stderr


def _leaf_fields(model=BotConfig, prefix=""):
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _leaf_fields(annotation, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", info


def _bounds(info) -> dict[str, object]:
    found = {}
    for meta in info.metadata:
        for attr in ("ge", "gt", "le", "lt", "max_length"):
            if getattr(meta, attr, None) is not None:
                found[attr] = getattr(meta, attr)
    return found


def test_every_number_has_finite_bounds_and_every_text_a_length_limit():
    unbounded = []
    for key, info in _leaf_fields():
        bounds = _bounds(info)
        if info.annotation in (int, float):
            if not ({"ge", "gt"} & set(bounds) and {"le", "lt"} & set(bounds)):
                unbounded.append(f"{key}: {bounds}")
        elif info.annotation is str or str(info.annotation).startswith("list"):
            if "max_length" not in bounds:
                unbounded.append(f"{key}: no max_length")
    assert unbounded == []


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[gateway]\noffline_expiry_seconds = 100000000000000\n", "gateway.offline_expiry_seconds"),
        ("[scheduling]\nlease_seconds = 1e12\n", "scheduling.lease_seconds"),
        ("[scheduling]\nexpire_after_seconds = 100000000000000\n", "scheduling.expire_after_seconds"),
        ("[scheduling]\nretry_backoff_seconds = inf\n", "scheduling.retry_backoff_seconds"),
        ("[chat]\nno_reply_timeout = nan\n", "chat.no_reply_timeout"),
        ("[chat]\nidle_evict_seconds = inf\n", "chat.idle_evict_seconds"),
        ("[gateway]\nmax_backlog = 1000000000000\n", "gateway.max_backlog"),
        ('[bot]\npersona = "' + "x" * 2_000_000 + '"\n', "bot.persona"),
    ],
)
def test_values_that_would_halt_delivery_are_refused_naming_the_key(text, key):
    with pytest.raises(ConfigError) as refused:
        parse_config(text)
    assert key in str(refused.value)


def test_the_key_variable_must_be_one_the_deployment_allows(monkeypatch):
    with pytest.raises(ConfigError) as refused:
        parse_config('[llm]\napi_key_env = "DJANGO_SUPERUSER_PASSWORD"\n')
    assert "llm.api_key_env" in str(refused.value) and "MAIBOT_LLM_KEY_ENVS" in str(refused.value)
    monkeypatch.setenv("MAIBOT_LLM_KEY_ENVS", "DEEPSEEK_API_KEY, SILICONFLOW_KEY")
    assert parse_config('[llm]\napi_key_env = "DEEPSEEK_API_KEY"\n').llm.api_key_env == "DEEPSEEK_API_KEY"
    with pytest.raises(ConfigError):
        parse_config('[llm]\napi_key_env = "MAIBOT_ADAPTER_TOKENS"\n')


def test_a_retired_key_is_named_in_the_operators_language_and_logged_in_english(caplog):
    from django.utils import translation

    from core.config.loading import _warned_retired, retired_keys

    data = {"plugins": {"pip_args": ["-r", "x"]}}
    with translation.override("zh-hans"):
        (chinese,) = retired_keys(data)
    with translation.override("en"):
        (english,) = retired_keys(data)
    assert chinese.startswith("plugins.pip_args 已不再是机器人配置项") and "MAIBOT_PIP_INDEX_URL" in chinese
    assert english.startswith("plugins.pip_args is no longer a bot config setting and is ignored")
    _warned_retired.discard(("plugins", "pip_args"))
    with translation.override("zh-hans"):
        parse_config('[plugins]\npip_args = ["-r", "x"]\n')
    assert "plugins.pip_args is no longer a bot config setting" in caplog.text
