"""The web page's behaviour in a real headless Chromium, with a stand-in model (no weights): the rule
in use shows before the first answer, Enter asks, picked examples get a right/wrong mark (also in
the history), and errors show next to the Ask button. The page on the real model, with its shading
and numbers checked against the API, is ``test_serve_browser.py``."""

from __future__ import annotations

import json

import pytest
from serve_helpers import StreamingModel, ask_on_page, chromium

from gnll.serving import AbstentionPolicy, ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread

pytestmark = pytest.mark.browser

#: Two picked examples the stand-in answers "Paris." to: one right, one wrong.
EXAMPLES = {
    "task": "triviaqa_short",
    "examples": [
        {"id": "a", "question": "Capital of France?", "prompt": "sure", "answers": ["Paris"]},
        {"id": "b", "question": "Capital of Italy?", "prompt": "sure", "answers": ["Rome"]},
    ],
}


@pytest.fixture(scope="module")
def page_url():
    policy = AbstentionPolicy(mode="flag", threshold=1.0)
    app = build_inprocess_app(StreamingModel(), ServeSettings(policy=policy), max_wait_ms=1)
    with ServerThread(app) as srv:
        yield srv.url


@pytest.fixture
def page(page_url):
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.route(
            "**/ui/api/examples*",
            lambda route: route.fulfill(content_type="application/json", body=json.dumps(EXAMPLES)),
        )
        page.goto(page_url + "/")
        page.wait_for_function(
            "document.querySelector('#example').options.length > 1", timeout=30_000
        )
        yield page


def test_the_rule_in_use_shows_before_the_first_answer(page):
    assert page.locator("#result").is_hidden()
    rule = page.locator("#rule").inner_text()
    assert "policy flag" in rule and "abstain when G-NLL > 1" in rule


def test_enter_asks_and_shift_enter_does_not(page):
    page.fill("#question", "What is the capital of France?")
    page.press("#question", "Shift+Enter")
    assert page.locator("#result").is_hidden()
    page.press("#question", "Enter")
    page.wait_for_selector("#answer[data-state=done]", timeout=30_000)
    assert "Paris" in page.locator("#answer").inner_text()
    assert page.locator("#verdict").is_hidden()  # a typed question has no gold answer


def test_picked_examples_are_marked_right_or_wrong_here_and_in_the_history(page):
    marks = []
    for index, expected in ((1, "✓ right"), (2, "✗ wrong")):
        page.select_option("#example", index=index)
        page.click("#ask")
        page.wait_for_function(
            f"document.querySelectorAll('#history tbody tr').length == {index}", timeout=30_000
        )
        verdict = page.locator("#verdict")
        assert verdict.is_visible() and verdict.inner_text().startswith(expected)
        assert "F1 > 0.5" in verdict.inner_text()
        marks.append(expected[0])
    header = page.locator("#history thead th").all_inner_texts()
    column = header.index("correct")
    shown = page.locator(f"#history tbody tr td:nth-child({column + 1})").all_inner_texts()
    assert sorted(shown) == sorted(marks)


def _ask_into_an_error(page, code: int | None) -> None:
    """Ask, the server answering a 400 whose error says "scripted failure" (its ``code``), and
    wait for the page to show the error."""
    body = {"error": {"message": "scripted failure", "type": "x", "param": None, "code": code}}
    page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(
            status=400, content_type="application/json", body=json.dumps(body)
        ),
    )
    page.fill("#question", "anything")
    page.click("#ask")
    page.wait_for_selector("#error:not([hidden])", timeout=30_000)


def test_errors_show_next_to_the_ask_button(page):
    _ask_into_an_error(page, 400)
    assert page.locator("#error").inner_text() == "scripted failure"
    button = page.locator("#ask").bounding_box()
    error = page.locator("#error").bounding_box()
    assert 0 <= error["y"] - (button["y"] + button["height"]) < 80  # right under the button


def test_an_error_clears_the_previous_answer(page):
    ask_on_page(page, "What is the capital of France?", timeout=30_000)
    assert page.locator("#result").is_visible()
    _ask_into_an_error(page, None)
    assert page.locator("#result").is_hidden()  # no unrelated old answer under the new error


def test_a_server_that_cannot_be_reached_is_said_in_words(page):
    page.route("**/v1/chat/completions", lambda route: route.abort())
    page.fill("#question", "anything")
    page.click("#ask")
    page.wait_for_selector("#error:not([hidden])", timeout=30_000)
    text = page.locator("#error").inner_text()
    assert "Cannot reach the gnll server" in text and "Failed to fetch" not in text


def test_the_rule_and_its_source_show_once(page):
    ask_on_page(page, "What is the capital of France?", timeout=30_000)
    assert page.locator("body").inner_text().count("abstain when G-NLL > 1") == 1


def test_one_token_is_singular(page):
    u = {"g_nll": 0.1, "num_tokens": 1, "tokens": ["Paris"], "token_logprobs": [-0.1]}
    chunk = {"choices": [{"index": 0, "delta": {"content": "Paris"}, "finish_reason": "stop"}]}
    last = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "uncertainty": u}]}
    events = f"data: {json.dumps(chunk)}\n\ndata: {json.dumps(last)}\n\ndata: [DONE]\n\n"
    page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(status=200, content_type="text/event-stream", body=events),
    )
    ask_on_page(page, "anything", timeout=30_000)
    assert page.locator("#n-tokens").inner_text() == "1 token"


def test_the_page_says_which_prompt_a_picked_question_was_sent_with(page):
    page.select_option("#example", index=1)
    page.click("#ask")
    page.wait_for_selector("#answer[data-state=done]", timeout=30_000)
    asked = page.locator("#asked").inner_text()
    assert "5-shot prompt of triviaqa_short" in asked


def test_no_request_of_the_page_fails(page_url):
    """Favicon included: the console shows no 404."""
    with chromium() as browser:
        page = browser.new_page()
        failed: list = []
        page.on("response", lambda r: failed.append(r.url) if r.status >= 400 else None)
        page.on("console", lambda m: failed.append(m.text) if m.type == "error" else None)
        page.goto(page_url + "/")
        page.wait_for_function(
            "document.querySelector('#rule').textContent.length > 0", timeout=30_000
        )
        page.wait_for_timeout(500)
    assert failed == []


def test_no_policy_is_not_a_green_verdict(page_url):
    """Under annotate nothing is decided: the decision box says "no policy" without a verdict's
    colour, and the rule line says there is no policy (was "policy annotate; none", in green)."""
    app = build_inprocess_app(StreamingModel(), ServeSettings(), max_wait_ms=1)
    with ServerThread(app) as srv, chromium() as browser:
        page = browser.new_page()
        page.goto(srv.url + "/")
        page.wait_for_function(
            "document.querySelector('#rule').textContent.length > 0", timeout=30_000
        )
        assert page.locator("#rule").inner_text().startswith("No policy")
        ask_on_page(page, "What is the capital of France?", timeout=30_000)
        decision = page.locator("#decision")
        assert decision.inner_text() == "no policy"
        classes = decision.get_attribute("class") or ""
        assert "answer-ok" not in classes and "no-policy" in classes
