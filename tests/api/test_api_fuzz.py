"""Schema-driven fuzzing of the proactive API with schemathesis against a live daphne server: whatever
a client sends, the answer is never a server error, and its status, content type and body are the
documented ones."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from api.access import api_token_create
from api.messages import proactive_message_create

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.live]

ST = Path(sys.executable).with_name("st")


@pytest.mark.long
def test_schemathesis_finds_no_server_error(start_server, make_session, tmp_path):
    data_dir = tmp_path / "data-fuzz"
    data_dir.mkdir()
    # The fuzzer sends hundreds of requests: keep it clear of the rate limit.
    (data_dir / "bot_config.toml").write_text("[api]\nrate_limit_per_minute = 100000\n", encoding="utf-8")
    _, base = start_server("fuzz")
    token, raw = api_token_create(name="fuzzer")
    make_session(chat_type="private", platform="qq", user_id="10001")
    make_session(chat_type="group", platform="qq", group_id="555")
    # A real pending message, so the {message_id} operations reach past "not found".
    pending = proactive_message_create(
        token=token,
        channel_type="qq",
        channel_user_id="10001",
        text="fuzz target",
        send_at=timezone.now() + timedelta(days=1),
    )
    config = tmp_path / "schemathesis.toml"
    config.write_text(f'[parameters]\n"path.message_id" = "{pending.pk}"\n', encoding="utf-8")
    result = subprocess.run(
        [
            str(ST),
            "--config-file",
            str(config),
            "run",
            f"{base}/api/v1/openapi.json",
            "--header",
            f"Authorization: Bearer {raw}",
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
            "--max-examples",
            "30",
            "--phases",
            "examples,coverage,fuzzing",
            "--workers",
            "1",
            "--seed",
            "20261122",
            "--generation-database",
            "none",
            "--request-timeout",
            "30",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    output = result.stdout + result.stderr
    print(output[-2500:])
    assert result.returncode == 0, output[-6000:]
    # It really ran: hundreds of generated requests, none of them failed.
    generated = re.search(r"(\d+) generated, (\d+) passed", output)
    assert generated and int(generated.group(1)) >= 200 and generated.group(1) == generated.group(2), output[-3000:]
