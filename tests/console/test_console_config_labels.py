"""The config form's labels: every config field and section has a readable title (pydantic's Field title,
marked with gettext_noop), shown translated as the field's label with its key beside it in monospace, in
Chinese on a Chinese page and in English on an English one; the search finds a field by its label in
either language. A new field without a title fails test_every_config_field_has_a_translated_title."""

from __future__ import annotations

import re

import pytest
from django.utils import translation
from django.utils.html import escape
from pydantic import BaseModel, Field

from core.config import BotConfig

ZH = "zh-CN,zh;q=0.9"
EN = "en-US,en;q=0.9"
CJK = re.compile(r"[\u4e00-\u9fff]")


def untitled(model: type[BaseModel], prefix: str = "") -> list[str]:
    """The fields of `model` (and of each section, for BotConfig) without a title, or whose title the
    Chinese catalog does not translate."""
    missing = []
    for key, info in model.model_fields.items():
        name = f"{prefix}{key}"
        with translation.override("zh-hans"):
            shown = translation.gettext(info.title) if info.title else ""
        if not info.title or not CJK.search(shown):
            missing.append(name)
        annotation = info.annotation
        if model is BotConfig and isinstance(annotation, type) and issubclass(annotation, BaseModel):
            missing += untitled(annotation, f"{key}.")
    return missing


def form_fields() -> list[tuple[str, str, str | None]]:
    """(section, key, title) of every field the form edits."""
    return [
        (section, key, info.title)
        for section, f in BotConfig.model_fields.items()
        for key, info in f.annotation.model_fields.items()
    ]


def title_in(language: str, title: str) -> str:
    with translation.override(language):
        return translation.gettext(title)


def test_every_config_field_has_a_translated_title():
    assert untitled(BotConfig) == []


def test_a_field_without_a_title_is_found():
    class Sample(BaseModel):
        titled: int = Field(1, title="Bot", description="x")
        bare: int = Field(1, description="a field someone added without a label")

    assert untitled(Sample) == ["bare"]


@pytest.mark.django_db
@pytest.mark.parametrize(("accept", "language"), [(ZH, "zh-hans"), (EN, "en")])
def test_every_field_and_section_is_labelled_in_the_page_language_with_its_key(operator, accept, language):
    page = operator.get("/admin/config/", HTTP_ACCEPT_LANGUAGE=accept).content.decode()
    fields = form_fields()
    assert len(fields) > 80
    for section, key, title in fields:
        label = title_in(language, title)
        assert bool(CJK.search(label)) == (language == "zh-hans"), (key, label)
        expected = f'<label for="id_{section}__{key}">{escape(label)} <code class="config-key">{key}</code></label>'
        assert expected in page, (section, key)
    for section, info in BotConfig.model_fields.items():
        heading = f'<h2>{escape(title_in(language, info.title))} <code class="config-key">[{section}]</code></h2>'
        assert heading in page, section


@pytest.mark.django_db
@pytest.mark.parametrize("accept", [ZH, EN])
def test_the_search_looks_in_the_label_in_both_languages(operator, accept):
    page = operator.get("/admin/config/", HTTP_ACCEPT_LANGUAGE=accept).content.decode()
    search = re.search(r'class="form-row field-chat__tool_timeout" data-search="([^"]*)"', page).group(1)
    assert "tool timeout (seconds)" in search and "工具超时（秒）" in search
    persona = re.search(r'class="form-row field-bot__persona" data-search="([^"]*)"', page).group(1)
    assert "persona" in persona and "人设" in persona and "机器人" in persona  # and its section's title
