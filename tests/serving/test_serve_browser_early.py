"""The web page of `gnll serve --policy refuse` says where an exact early decision was made (headless
Chromium, as tests/serving/test_serve_browser.py drives it)."""

from __future__ import annotations

import httpx
import pytest
from serve_helpers import ask_on_page, chromium

from gnll.serving import AbstentionPolicy, ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread

pytestmark = [pytest.mark.browser, pytest.mark.model]

QUESTION = "Tell me a long story about a dragon who learns to cook."


def test_page_shows_the_early_decision_token(smollm):
    settings = ServeSettings(policy=AbstentionPolicy(mode="refuse", threshold=2.0))
    with ServerThread(build_inprocess_app(smollm, settings)) as srv:
        config = httpx.get(srv.url + "/ui/api/config").json()
        api = httpx.post(  # the request the page sends
            srv.url + "/v1/chat/completions",
            json={
                "messages": [
                    {
                        "role": "user",
                        "content": f"{config['instruction']}\nQuestion: {QUESTION}\nAnswer:",
                    }
                ],
                "temperature": 0,
                "max_tokens": config["max_tokens"],
                "stop": config["stop"],
                "logprobs": True,
                "top_logprobs": 5,
            },
            timeout=120,
        ).json()["choices"][0]["uncertainty"]
        assert api["early"] is True and api["refused"] is True
        with chromium() as b:
            page = b.new_page()
            page.goto(srv.url + "/")
            page.wait_for_function(
                "document.querySelector('#example').options.length > 1", timeout=60_000
            )
            ask_on_page(page, QUESTION, timeout=120_000)
            note = page.locator("#early")
            assert note.is_visible()
            text = note.inner_text()
            assert f"decided at token {api['decided_at_token']} " in text
            assert "never generated" in text
            assert page.locator("#decision").inner_text() == "abstain"
