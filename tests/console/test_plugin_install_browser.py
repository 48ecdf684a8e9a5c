"""The Plugins page's Install form in headless Chromium against a real daphne, in Simplified Chinese and in
English: the form is in the browser's language; a zip chosen in the file field installs the plugin (the
message says where, in that language) and the folder watcher loads it (its state shown in that language);
a zip with a path outside the plugin's folder is refused with its reason and nothing more is written; the
Update form replaces the installed plugin by its new version (the operator's config.toml kept) and the
watcher reloads it."""

from __future__ import annotations

import re

import pytest

from tests.conftest import CHROMIUM_ARGS, require_chromium, wait_for
from tests.plugins.install_helpers import (
    WEATHER_FOLDER,
    WEATHER_ID,
    make_zip,
    plugin_files,
    tree,
    weather_manifest,
    with_entry,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.live]

LOADED = {"zh-CN": "已加载", "en-US": "loaded"}  # the plugin's state, in the page's language


@pytest.mark.parametrize(
    ("locale", "texts"),
    [
        (
            "zh-CN",
            {
                "heading": "添加插件",
                "button": "安装",
                "done": "已将",
                "refused": "指向插件文件夹之外",
                "replace": "替换为新版本",
                "updated": "从 1.2.0 更新到 1.3.0",
                "kept": "已保留你的 config.toml",
                "row": "已更新",
            },
        ),
        (
            "en-US",
            {
                "heading": "Add a plugin",
                "button": "Install",
                "done": "Installed",
                "refused": "leads outside",
                "replace": "Replace with the new version",
                "updated": "from 1.2.0 to 1.3.0",
                "kept": "config.toml is kept",
                "row": "updated",
            },
        ),
    ],
)
def test_the_install_form_installs_a_zip_refuses_a_harmful_one_and_the_update_form_replaces_it(
    browser_operator, start_server, tmp_path, locale, texts
):
    require_chromium()
    from playwright.sync_api import sync_playwright

    good, bad = tmp_path / "weather.zip", tmp_path / "evil.zip"
    good.write_bytes(make_zip(plugin_files(), "weather-main/"))
    bad.write_bytes(with_entry(plugin_files(), "../../evil.py"))
    proc, base = start_server()
    plugins = tmp_path / "data-web" / "plugins"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=require_chromium(), args=CHROMIUM_ARGS, headless=True)
        page = browser.new_context(locale=locale, viewport={"width": 1280, "height": 900}).new_page()
        page.set_default_timeout(30_000)
        page.goto(f"{base}/admin/login/?next=/admin/plugins/")
        page.fill("#id_username", "op")
        page.fill("#id_password", "pw-123456")
        page.click("input[type=submit]")
        page.wait_for_url(f"{base}/admin/plugins/")
        form = page.locator("#plugin-install")
        assert form.locator("h2").inner_text() == texts["heading"]
        assert page.locator("#plugin-install-submit").inner_text() == texts["button"]

        page.set_input_files("#plugin-archive", str(good))
        page.click("#plugin-install-submit")
        page.wait_for_url(f"{base}/admin/plugins/")
        message = page.locator(".messagelist .success").inner_text()
        assert texts["done"] in message and f"plugins/{WEATHER_FOLDER}/" in message
        proc.wait_for_output(f"plugin {WEATHER_ID}: new plugin → loaded", 60)
        page.reload()
        assert page.locator(f'tr.plugin[data-plugin="{WEATHER_ID}"] td.state').inner_text() == LOADED[locale]
        page.screenshot(path=f"/tmp/maibot-console-plugin-install-{locale}.png", full_page=True)

        page.set_input_files("#plugin-archive", str(bad))
        page.click("#plugin-install-submit")
        page.wait_for_url(f"{base}/admin/plugins/")
        assert texts["refused"] in page.locator(".messagelist .error").inner_text()

        # Update: the operator's config.toml stays, the new version's files come in, the watcher reloads it.
        config = plugins / WEATHER_FOLDER / "config.toml"
        config.write_text('[plugin]\nconfig_version = "1.0.0"\nenabled = true\n# the operator\'s\n')
        newer = tmp_path / "weather-1.3.0.zip"
        newer.write_bytes(make_zip({**plugin_files(), "_manifest.json": weather_manifest(version="1.3.0")}))
        loaded = re.compile(rf"plugin {re.escape(WEATHER_ID)}: .* → loaded")
        loads = len(loaded.findall(proc.output()))
        assert page.locator("#plugin-update-submit").inner_text() == texts["replace"]
        page.select_option("#plugin-update-id", WEATHER_ID)
        page.set_input_files("#plugin-update-archive", str(newer))
        page.click("#plugin-update-submit")
        page.wait_for_url(f"{base}/admin/plugins/")
        message = page.locator(".messagelist .success").inner_text()
        assert texts["updated"] in message and texts["kept"] in message, message
        assert wait_for(lambda: len(loaded.findall(proc.output())) > loads, timeout=60), proc.output()
        page.reload()
        assert page.locator(f'tr.plugin[data-plugin="{WEATHER_ID}"] td.state').inner_text() == LOADED[locale]
        assert texts["row"] in page.locator("body").inner_text()
        page.screenshot(path=f"/tmp/maibot-console-plugin-update-{locale}.png", full_page=True)
        browser.close()
    assert "# the operator's" in config.read_text()
    assert '"1.3.0"' in (plugins / WEATHER_FOLDER / "_manifest.json").read_text()
    assert sorted(p.name for p in plugins.iterdir()) == [WEATHER_FOLDER]
    assert set(plugin_files()) <= set(tree(plugins / WEATHER_FOLDER))
    assert not (tmp_path / "evil.py").exists() and not (tmp_path / "data-web" / "evil.py").exists()
