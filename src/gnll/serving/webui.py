"""The web page at ``/``: ask a question, see each token shaded by its probability and the G-NLL.

Plain HTML, CSS and a small script in ``static/`` (no build step, nothing fetched from outside).
The page talks to the public ``/v1/chat/completions`` route like any client; the ``/ui/api`` routes
only give it the server's set-up, example questions from the evaluation tasks, and whether an
answer to a picked example is right (the evaluation's own F1 rule, :func:`f1_verdict`).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Query
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field

from gnll.serving.responses import error_body
from gnll.serving.service import Service
from gnll.serving.settings import ServeSettings

STATIC = Path(__file__).parent / "static"
#: The tasks whose questions the page offers (short answers: what G-NLL is calibrated on).
UI_TASKS = ("triviaqa_short", "svamp_short", "nq_open_short")
STOP = ["\n", "Question:", "Context:"]


class JudgeRequest(BaseModel):
    """An answer to a picked example and the example's gold answers."""

    answer: str = Field(max_length=10_000)
    answers: list[str] = Field(min_length=1, max_length=1000)
    numeric_answer: float | None = None


def add_routes(app: FastAPI, service: Service, settings: ServeSettings) -> None:
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> FileResponse:
        # Browsers and tools ask for /favicon.ico whatever the page links: the same icon.
        return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml")

    @app.get("/ui/api/config")
    async def config() -> dict[str, Any]:
        from gnll.evaluation.data.prompts import BRIEF_SHORT

        return {
            **service.describe(),
            "policy": settings.policy.describe(),
            "tasks": list(UI_TASKS),
            "instruction": BRIEF_SHORT,
            "stop": STOP,
            "max_tokens": 50,
            # the routes that answer with uncertainty (the page asks the first)
            "apis": ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"],
        }

    @app.post("/ui/api/judge")
    async def judge(req: JudgeRequest) -> dict[str, Any]:
        from gnll.evaluation.results.correctness import F1_THRESHOLD, f1_verdict

        verdict = f1_verdict(req.answer, req.answers, req.numeric_answer)
        rule = "numeric match" if verdict.detail == "numeric" else f"F1 > {F1_THRESHOLD:g}"
        return {"correct": verdict.correct, "score": verdict.score, "rule": rule}

    @app.get("/ui/api/examples", response_model=None)
    async def examples(
        task: str = Query("triviaqa_short"), limit: int = Query(25, ge=1, le=200)
    ) -> dict[str, Any] | JSONResponse:
        if task not in UI_TASKS:
            message = f"unknown task {task!r}; choose from {list(UI_TASKS)}"
            return JSONResponse(error_body(message, "invalid_request_error", param="task"), 400)
        try:
            return {"task": task, "examples": _examples(task, str(settings.data_dir or ""), limit)}
        except (FileNotFoundError, ValueError) as exc:
            first = str(exc).splitlines()[0]
            return JSONResponse(error_body(first, "not_found_error"), status_code=404)


@lru_cache(maxsize=8)
def _examples(task: str, data_dir: str, limit: int) -> list[dict[str, Any]]:
    from gnll.evaluation.data.tasks import get_task

    data = get_task(task).load(data_dir=data_dir or None)
    return [
        {
            "id": ex.id,
            "question": data.task.judge_question(ex),
            "prompt": data.prompt(ex),
            "answers": list(ex.answers),
            "numeric_answer": ex.numeric_answer,
        }
        for ex in data.split("eval", limit)
    ]
