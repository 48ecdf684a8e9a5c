"""The config form's section list and search: every section linked from the top, every field carrying what
the search looks in (key, section, its help in Chinese and in English) and no value (the whole page is
checked for secrets by test_console_config_secrets)."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.django_db

ZH = "zh-CN,zh;q=0.9"


def form_page(client, language: str = "en-US,en;q=0.9") -> str:
    return client.get("/admin/config/", HTTP_ACCEPT_LANGUAGE=language).content.decode()


def test_every_section_is_listed_and_linked(operator):
    page = form_page(operator)
    nav = page.split('id="config-sections"', 1)[1].split("</nav>", 1)[0]
    linked = re.findall(r'<a href="#section-(\w+)"', nav)
    fieldsets = re.findall(r'<fieldset class="module aligned" id="section-(\w+)">', page)
    assert linked == fieldsets and {"bot", "llm", "chat", "scheduling"} <= set(linked)
    assert page.index('id="config-search"') < page.index('id="config-form"')


@pytest.mark.parametrize("language", [ZH, "en-US,en;q=0.9"])
def test_a_field_is_found_by_chinese_and_english_words_in_either_language(operator, language):
    page = form_page(operator, language)
    search = re.search(r'class="form-row field-chat__tool_timeout" data-search="([^"]*)"', page).group(1)
    assert "tool_timeout" in search and "chat.tool_timeout" in search
    assert "timed out" in search and "超时" in search  # its help in English and in Chinese
