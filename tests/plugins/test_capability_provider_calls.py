"""llm.embed and llm.transcribe_audio through the real maibot-plugin-sdk's PluginContext and the real
openai client against a local OpenAI-compatible server (tests/fake_llm.py): MaiBot 1.3's shapes (one
embedding or results; text and content), the operator's `[llm] embedding` / `[llm] voice` routes, the
ledger and the daily budgets; refusals are error results."""

from __future__ import annotations

import base64
import re

import pytest

from chat.models import LLMCall
from core import config
from tests.fake_llm import FakeLLM
from tests.plugins.sdk_context import plugin, run

pytestmark = pytest.mark.django_db(transaction=True)

EMBEDDER = "test.core.embedder"


@pytest.fixture
def server():
    with FakeLLM() as fake, config.override(llm={"base_url": fake.base_url, "model": "fake-model", "max_retries": 0}):
        yield fake


def embedding(text: str) -> list[float]:
    return [float(len(text)), float(sum(map(ord, text)) % 97), 1.0]  # what FakeLLM answers


def test_one_text_or_several_come_back_in_maibots_shapes_and_go_in_the_ledger(server):
    _, ctx = plugin(EMBEDDER, ["llm.embed"])
    with config.override(llm={"embedding": ["default"]}):
        one = run(ctx.llm.embed("今天天气不错"))
        several = run(ctx.llm.embed(texts=["a", "bb"]))
    assert one == {"success": True, "embedding": embedding("今天天气不错"), "model_name": "default"}
    assert several == {
        "success": True,
        "results": [
            {"embedding": embedding("a"), "model_name": "default"},
            {"embedding": embedding("bb"), "model_name": "default"},
        ],
    }
    assert [r["input"] for r in server.embedding_requests] == [["今天天气不错"], ["a", "bb"]]
    assert server.requests == []  # no chat completion
    rows = list(LLMCall.objects.order_by("pk").values_list("purpose", "model", "prompt_tokens", "error"))
    assert rows == [(f"plugin:{EMBEDDER}", "fake-model", 6, ""), (f"plugin:{EMBEDDER}", "fake-model", 3, "")]


def test_without_a_route_a_budget_or_a_provider_it_is_an_error_result(server):
    _, ctx = plugin(EMBEDDER, ["llm.embed"])
    none = run(ctx.llm.embed("x"))
    assert none == {"success": False, "error": "no embedding model is configured ([llm] embedding)"}
    assert run(ctx.llm.embed("x", texts=["y"]))["error"] == "text 与 texts 只能提供一个"
    assert run(ctx.llm.embed("   "))["error"] == "缺少必要参数 text 或 texts"
    assert "第 2 项" in run(ctx.llm.embed(texts=["ok", ""]))["error"]

    capped = {"embedding": ["default"], "budgets": [{"scope": "model", "target": "default", "daily_tokens": 5}]}
    with config.override(llm=capped):
        assert run(ctx.llm.embed("1234567"))["success"] is True  # 7 tokens: the cap is reached after it
        refused = run(ctx.llm.embed("more"))
    assert refused["success"] is False and "daily budget reached" in refused["error"]
    assert len(server.embedding_requests) == 1

    server.embedding_status = 500
    with config.override(llm={"embedding": ["default"]}):
        failed = run(ctx.llm.embed("x"))
    assert failed["success"] is False and failed["error"].startswith("default: ")
    assert LLMCall.objects.exclude(error="").count() == 1


def test_a_plugin_that_did_not_declare_llm_embed_is_refused(server):
    _, ctx = plugin("test.core.nosy", ["llm.generate"])
    with (
        config.override(llm={"embedding": ["default"]}),
        pytest.raises(RuntimeError, match=re.escape("llm.embed is not declared")),
    ):
        run(ctx.llm.embed("x"))
    assert server.embedding_requests == []


def test_speech_becomes_text_through_the_voice_route(server):
    _, ctx = plugin(EMBEDDER, ["llm.transcribe_audio"])
    ogg = b"OggS" + b"\x00" * 64
    assert run(ctx.llm.transcribe_audio(audio_base64=base64.b64encode(ogg).decode()))["error"] == (
        "no voice model is configured ([llm] voice)"
    )
    with config.override(llm={"voice": ["default"]}):
        heard = run(ctx.llm.transcribe_audio(ogg))  # bytes: the SDK encodes them
        data_url = run(ctx.llm.transcribe_audio("data:audio/ogg;base64," + base64.b64encode(ogg).decode()))
        server.transcript = ""
        silent = run(ctx.llm.transcribe_audio(ogg))
    assert heard == data_url == {"success": True, "text": "你好，麦麦", "content": "你好，麦麦"}
    assert silent == {"success": False, "text": "", "content": ""}  # as MaiBot: no text is no success
    (first, *_) = server.transcription_requests
    assert ogg in first and b'filename="voice.ogg"' in first and b"fake-model" in first
    assert LLMCall.objects.filter(purpose=f"plugin:{EMBEDDER}").count() == 3
    assert run(ctx.llm.transcribe_audio(audio_base64=""))["error"] == "缺少必要参数 audio_base64 或 voice_base64"
