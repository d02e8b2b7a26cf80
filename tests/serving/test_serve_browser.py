"""The web page of `gnll serve` in a real headless Chromium (Debian's package, driven by Playwright).

The page is asked a typed question and a TriviaQA question from the bundled data; the tokens it
shades and the G-NLL it shows must be the API's, and the session history must be sorted by G-NLL.
A screenshot is saved (to ``$GNLL_SCREENSHOT`` when set: that is how docs/serving.md's picture is
made, ``GNLL_SCREENSHOT=docs/img/serving-page.png pytest tests/serving/test_serve_browser.py``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import httpx
import pytest
from serve_helpers import chromium

from gnll.serving import AbstentionPolicy, ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread

pytestmark = [pytest.mark.browser, pytest.mark.model]


@pytest.fixture(scope="module")
def page_server(smollm):
    # The calibration shipped for the model (its coverage rule: the accuracy rule of SmolLM2's file
    # abstains on everything, see docs/serving.md).
    policy = AbstentionPolicy.from_calibration("auto", model=smollm.name, rule="coverage")
    # The page asks questions, as `gnll ask` does: the shipped calibration's prompt format.
    settings = ServeSettings(policy=policy, prompt_format="instruction")
    with ServerThread(build_inprocess_app(smollm, settings)) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def api_answer(url: str, prompt: str) -> dict:
    r = httpx.post(
        url + "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0,
            "max_tokens": 50,
            "stop": ["\n", "Question:", "Context:"],
            "logprobs": True,
        },
        timeout=120,
    )
    r.raise_for_status()
    return r.json()["choices"][0]


def shown(page) -> tuple[list[str], list[float], float]:
    spans = page.locator("#answer .tok")
    texts = spans.all_inner_texts()
    lps = [float(spans.nth(i).get_attribute("data-logprob")) for i in range(spans.count())]
    return texts, lps, float(page.locator("#g-nll").inner_text())


def _rgb(css: str) -> tuple[int, ...]:
    return tuple(int(v) for v in css[css.index("(") + 1 : css.index(")")].split(",")[:3])


def _expected_rgb(p: float) -> tuple[int, ...]:
    """app.js's shade(): hsl(120 p, 75%, 88 - 18 (1 - |2p - 1|) %)."""
    import colorsys

    hue = round(120 * p) / 360
    light = round(88 - 18 * (1 - abs(2 * p - 1))) / 100
    return tuple(round(255 * v) for v in colorsys.hls_to_rgb(hue, light, 0.75))


def test_page_shows_the_apis_tokens_and_g_nll(page_server, browser, tmp_path):
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    page.goto(page_server.url + "/")
    page.wait_for_function("document.querySelector('#example').options.length > 1", timeout=60_000)

    question = "What is the capital of France?"
    page.fill("#question", question)
    # The page streams: count the token spans drawn while the answer arrives.
    page.evaluate(
        """() => { window.liveSpans = 0; new MutationObserver((ms) => { for (const m of ms)
             for (const n of m.addedNodes) if (n.classList && n.classList.contains('live'))
               window.liveSpans++; }).observe(document.querySelector('#answer'), {childList: true}); }"""
    )
    page.click("#ask")
    page.wait_for_selector("#answer[data-state=done]", timeout=120_000)
    texts, lps, g_shown = shown(page)
    config = httpx.get(page_server.url + "/ui/api/config").json()
    assert config["prompt_format"]["chat"] == "instruction"  # the server wraps the question
    api = api_answer(page_server.url, question)
    u = api["uncertainty"]
    assert u["prompt_format"] == "instruction"
    assert "Paris" in "".join(texts)
    assert "".join(texts) == "".join(u["tokens"]).lstrip()
    assert lps == pytest.approx(u["token_logprobs"], abs=1e-9)  # same path: the page shows the record's own log-probs
    assert page.evaluate("window.liveSpans") == len(u["tokens"])  # drawn as they came
    assert g_shown == pytest.approx(u["g_nll"], abs=5e-5)  # shown with 4 decimals  # same path: the page rounds the record's value to 4 decimals
    # Each token's shade is its probability's colour (red at p=0 to green at p=1).
    colours = page.eval_on_selector_all(
        "#answer .tok", "els => els.map(e => getComputedStyle(e).backgroundColor)"
    )
    assert [_rgb(c) for c in colours] == [
        pytest.approx(_expected_rgb(math.exp(lp)), abs=2) for lp in u["token_logprobs"]
    ]
    assert float(page.locator("#p-correct").inner_text()) == pytest.approx(u["p_correct"], abs=5e-4)
    # The calibration is named once, in the rule line (not again on the cards).
    assert "smollm2-135m-instruct.json (shipped)" in page.locator("#rule").inner_text()
    assert page.locator("body").inner_text().count("smollm2-135m-instruct.json (shipped)") == 1
    decision = page.locator("#decision").inner_text()
    assert decision == ("abstain" if u["abstain"] else "answer")

    # A TriviaQA question from the bundled data, through the picker.
    page.select_option("#task", "triviaqa_short")
    page.wait_for_function("document.querySelector('#example').options.length > 1")
    page.select_option("#example", index=1)
    page.fill("#question", "")
    page.click("#ask")
    page.wait_for_function(
        "document.querySelectorAll('#history tbody tr').length == 2", timeout=120_000
    )
    rows = page.locator("#history tbody tr td:first-child").all_inner_texts()
    values = [float(v) for v in rows]
    assert values == sorted(values, reverse=True)  # most uncertain first
    assert all(math.isfinite(v) for v in values)
    # The picked question's answer is marked right or wrong by the evaluation's F1 rule, and the
    # history says which row it was (the typed question has no gold answer: "–").
    from gnll.evaluation.results.correctness import f1_verdict

    answer = page.locator("#answer").inner_text().strip()
    # This server asks every chat message as gnll ask does: the page says so, and sent it bare.
    assert "zero-shot instruction" in page.locator("#asked").inner_text()
    gold = page.evaluate("state.examples[1].answers")
    right = f1_verdict(answer, gold).correct
    assert page.locator("#verdict").inner_text().startswith("✓ right" if right else "✗ wrong")
    marks = page.locator("#history tbody tr td:nth-child(4)").all_inner_texts()
    assert sorted(marks) == sorted(["–", "✓" if right else "✗"])

    page.hover("#answer .tok >> nth=0")
    tip = page.locator("#tooltip").inner_text()
    assert "log-prob" in tip
    out = Path(os.environ.get("GNLL_SCREENSHOT") or tmp_path / "serving-page.png")
    out.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out), full_page=True)
    assert out.stat().st_size > 10_000
    page.close()


def test_page_asks_for_the_key_when_auth_is_on(smollm, browser):
    settings = ServeSettings(api_key="page-key-1")
    with ServerThread(build_inprocess_app(smollm, settings)) as srv:
        page = browser.new_page()
        page.goto(srv.url + "/")
        page.wait_for_selector("#api-key:not([hidden])")
        assert "enter the API key" in page.locator("#server-info").inner_text()
        page.fill("#api-key", "page-key-1")
        page.dispatch_event("#api-key", "change")
        page.wait_for_function("document.querySelector('#task').options.length == 3")
        page.close()
