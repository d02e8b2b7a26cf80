"""The typed wire layer (gnll.serving.protocol): one shape per API owns its bodies, chunks and
log-prob shape, so no other serving module tells the APIs apart."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from gnll.serving.protocol.chat import CHAT, ChatCompletionRequest
from gnll.serving.protocol.completions import COMPLETIONS, CompletionRequest
from gnll.serving.responses import Answer
from gnll.uncertainty import Uncertainty

SERVING = Path(__file__).parents[2] / "src" / "gnll" / "serving"

RECORD = Uncertainty(decoding="greedy", g_nll=0.3, ln_g_nll=0.26, nll=0.3, num_tokens=2)
ANSWER = Answer(" Paris", "stop", [" Par", "is"], [-0.1, -0.2], top_logprobs=[{" Par": -0.1}] * 2)


def test_no_serving_module_tells_the_apis_apart_by_a_flag():
    """Asking "is this chat?" outside the protocol package is what the shapes replace."""
    found = [
        f"{p.relative_to(SERVING)}:{i}"
        for p in SERVING.rglob("*.py")
        if "protocol" not in p.parts
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\bis_chat\b|\bchat: bool\b|chat=req", line)
    ]
    assert found == []


@pytest.mark.parametrize(
    ("req", "openai_type"),
    [
        (CompletionRequest(prompt="q", logprobs=1), Completion),
        (
            ChatCompletionRequest(
                messages=[{"role": "user", "content": "q"}], logprobs=True, top_logprobs=1
            ),
            ChatCompletion,
        ),
    ],
)
def test_each_shape_builds_a_body_the_openai_types_read(req, openai_type):
    body = req.shape.body(req, "m", [ANSWER], [" Paris"], ["stop"], [RECORD], prompt_tokens=3)
    parsed = openai_type.model_validate(body)
    assert parsed.usage.total_tokens == 5
    assert body["choices"][0]["uncertainty"] == RECORD.to_json()  # the record's own JSON
    assert req.shape.text_of(body["choices"][0]) == " Paris"


def test_a_refused_answer_carries_no_logprobs_in_either_shape():
    refused = RECORD.model_copy(update={"refused": True})
    for req in (
        CompletionRequest(prompt="q", logprobs=1),
        ChatCompletionRequest(messages=[{"role": "user", "content": "q"}], logprobs=True),
    ):
        body = req.shape.body(req, "m", [ANSWER], ["no"], ["stop"], [refused], prompt_tokens=0)
        assert body["choices"][0]["logprobs"] is None


def test_chat_chunks_validate_and_keep_openais_key_order():
    base = CHAT.chunk_base("m")
    opening = {**base, "choices": [CHAT.opening(0)]}
    piece = {**base, "choices": [CHAT.piece(0, " Par", CHAT.piece_logprobs(ANSWER, 0))]}
    last = {**base, "choices": [CHAT.last(0, "stop", RECORD)]}
    for chunk in (opening, piece, last):
        ChatCompletionChunk.model_validate(chunk)
    assert list(opening["choices"][0]) == ["index", "delta", "logprobs", "finish_reason"]
    assert list(last["choices"][0]) == [
        "index",
        "logprobs",
        "finish_reason",
        "uncertainty",
        "delta",
    ]
    assert last["choices"][0]["delta"] == {}
    assert COMPLETIONS.opening(0) is None
    assert COMPLETIONS.piece_logprobs(ANSWER, 7)["text_offset"] == [7, 11]


def _source(name: str) -> str:
    return (SERVING / name).read_text()


def test_the_proxy_reads_server_sent_events_in_one_place():
    """One reader (with an optional watch) serves the proxy's live relay and its early decisions."""
    places = [SERVING / "proxy.py", SERVING / "cascade.py", *(SERVING / "streams").glob("*.py")]
    readers = [
        p.name
        for p in places
        if "aiter_lines" in p.read_text() or 'startswith("data:")' in p.read_text()
    ]
    assert readers == ["upstream.py"]


def test_the_cascade_never_parses_json_or_sse_text():
    """It gets typed answers, the answering model and a stream's error from the reply."""
    cascade = _source("cascade.py")
    assert "import json" not in cascade and "json.loads" not in cascade
    assert "'\"uncertainty\"' in" not in cascade  # no sniffing of a chunk's text
    assert not re.search(r"\bstream_error\(", cascade)


def test_the_one_reader_stops_where_its_watch_says_and_closes_the_upstream():
    import asyncio

    from gnll.serving.streams.upstream import UpstreamStream

    class Response:
        closed = False
        sent = 0

        async def aiter_lines(self):
            for i in range(5):
                self.sent += 1
                yield f'data: {{"id": "x", "choices": [{{"index": 0, "text": "{i}"}}]}}'
            yield "data: [DONE]"

        async def aclose(self):
            self.closed = True

    class StopAtTwo:
        seen = 0

        def see(self, acc, choice):
            self.seen += 1

        @property
        def done(self):
            return self.seen >= 2

    async def read():
        response = Response()
        reader = UpstreamStream(response, COMPLETIONS, StopAtTwo())
        got = [c async for c in reader]
        return got, reader, response

    got, reader, response = asyncio.run(read())
    assert len(got) == 2 and response.sent == 2 and response.closed
    assert not reader.finished and reader.choices[0].choice()["text"] == "01"
