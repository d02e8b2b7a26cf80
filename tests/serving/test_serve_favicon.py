"""`/favicon.ico` is served (browsers and tools ask for it whatever the page links): it was a 404."""

from __future__ import annotations

import httpx
from serve_helpers import ScriptedModel

from gnll.serving import ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread


def test_favicon_ico_is_the_pages_icon():
    with ServerThread(build_inprocess_app(ScriptedModel(), ServeSettings(), max_wait_ms=1)) as srv:
        r = httpx.get(srv.url + "/favicon.ico", timeout=30)
        linked = httpx.get(srv.url + "/static/favicon.svg", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml")
    assert r.content == linked.content
