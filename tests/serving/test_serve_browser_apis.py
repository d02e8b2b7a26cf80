"""The web page asks through any of the three APIs (`/v1/chat/completions`, `/v1/responses`,
`/v1/messages`, the "through" picker) and shows the same answer and G-NLL for each, in a real
headless Chromium, in front of the scripted stand-in model."""

from __future__ import annotations

import pytest
from serve_helpers import SURE, StreamingModel, chromium

from gnll.serving import ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread

pytestmark = pytest.mark.browser


def test_the_page_asks_through_each_api_with_the_same_g_nll():
    app = build_inprocess_app(StreamingModel(), ServeSettings(), max_wait_ms=1)
    with ServerThread(app) as srv, chromium() as browser:
        page = browser.new_page()
        page.goto(srv.url + "/")
        page.wait_for_function("document.querySelector('#task').options.length > 0")
        shown = {}
        for api in ("chat", "responses", "messages"):
            page.select_option("#api", api)
            page.fill("#question", "unsure")
            page.evaluate("document.querySelector('#answer').dataset.state = ''")
            page.click("#ask")
            page.wait_for_selector("#answer[data-state=done]", timeout=30_000)
            assert page.locator("#error").is_hidden(), page.locator("#error").inner_text()
            text = page.locator("#answer").inner_text().replace("\n", "")
            shown[api] = (text, float(page.locator("#g-nll").inner_text()))
    # The page wraps a typed question in gnll ask's instruction: the stand-in's sure answer.
    sure = ("".join(SURE[0]), pytest.approx(-sum(SURE[1]), abs=5e-5))  # same path: the page rounds the record's value to 4 decimals
    assert shown == {api: sure for api in ("chat", "responses", "messages")}
