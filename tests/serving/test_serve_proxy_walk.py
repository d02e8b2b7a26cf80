"""The walk of an escalating proxy stream: how often a request's path comes (back) to
``serving/proxy.py``.

``gnll serve --upstream SMALL --policy escalate --escalate-to LARGE``, a streamed greedy chat request
that escalates (the stand-ins of tests/escalate_standins.py; the small answer is cut at its exact
early decision). The request is driven in this thread through the app (ASGI, the service started by
the app's lifespan), so that a profiler (:func:`sys.setprofile`) sees every Python frame the request
runs: the app, the cascade, both proxies, the stream reader, the policy.

What is counted: each invocation of a function of ``proxy.py`` made from code outside ``proxy.py``
(a coroutine or generator counted once, however often it is resumed). That is each time the walk
arrives at the proxy module from elsewhere: the cascade asking the small upstream, asking the large
one, and, before, pulling each chunk of the large answer's relay out of ``proxy.py``. Calls
``proxy.py`` makes itself (to the reader, the policy) and their returns are inside one visit.
"""

from __future__ import annotations

import asyncio
import sys
from types import FrameType
from typing import Any

import httpx
import pytest
from escalate_standins import LargeUpstream, SmallUpstream, cascade_app

import gnll.serving.proxy

PROXY = gnll.serving.proxy.__file__

#: The most times an escalating stream may arrive at ``proxy.py``: once per upstream asked.
MOST_VISITS = 2


class Visits:
    """A profiler that lists the ``proxy.py`` functions entered from outside ``proxy.py``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.visits: list[str] = []
        #: Every move of control into proxy.py (a call, a resumption or a return from a callee).
        self.moves = 0
        self._seen: list[FrameType] = []  # kept alive, so that no id is reused

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        here = frame.f_code.co_filename == self.path
        caller = frame.f_back
        caller_here = caller is not None and caller.f_code.co_filename == self.path
        if event == "call" and here:
            if not caller_here:
                self.moves += 1
            if not any(f is frame for f in self._seen):
                self._seen.append(frame)
                if not caller_here:
                    where = caller.f_code.co_name if caller is not None else "?"
                    self.visits.append(f"{frame.f_code.co_qualname} (from {where})")
        elif event == "return" and not here and caller_here:
            self.moves += 1


async def _walk(app: Any, path: str, body: dict[str, Any]) -> tuple[httpx.Response, Visits]:
    visits = Visits(PROXY)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gnll") as client:
            sys.setprofile(visits)
            try:
                response = await client.post(path, json=body, timeout=60)
            finally:
                sys.setprofile(None)
    return response, visits


@pytest.mark.parametrize("early", [True, False], ids=["early", "whole"])
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_an_escalating_stream_comes_to_the_proxy_module_once_per_upstream(chat, early):
    path, ask = (
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "q"}]})
        if chat
        else ("/v1/completions", {"prompt": "q"})
    )
    body = {**ask, "max_tokens": 40, "stream": True}
    with (
        SmallUpstream(tokens=40, pause=0.02) as small,
        LargeUpstream(tokens=[" Par", "is", "."]) as large,
    ):
        app = cascade_app(small, large, early=early)
        response, visits = asyncio.run(_walk(app, path, body))
    assert response.status_code == 200, response.text
    events = [line for line in response.text.splitlines() if line.startswith("data:")]
    assert events[-1] == "data: [DONE]" and '"answered_by": "large"' in response.text
    # it did escalate (early: the small stream was cut at the decision, near token 7 however
    # slowly the profiled proxy runs)
    assert len(large.bodies) == 1 and small.disconnected == [early]
    print(f"visits to proxy.py: {len(visits.visits)} {visits.visits}; moves into it: {visits.moves}")
    assert len(visits.visits) <= MOST_VISITS, visits.visits
