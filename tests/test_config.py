"""The bot configuration: created on first run, validated, and an invalid file stops start-up."""

import subprocess
import sys

import pytest

from maibot.config import BotConfig, ConfigError, load_config, parse_config
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
    assert result.returncode != 0
    assert "Invalid bot configuration" in result.stderr
    assert "bot.time_zone" in result.stderr and "Nowhere/Land" in result.stderr
