"""The web page at ``/``: ask a question, see each token shaded by its probability and the G-NLL.

Plain HTML, CSS and a small script in ``static/`` (no build step, nothing fetched from outside).
The page talks to the public ``/v1/chat/completions`` route like any client; the two ``/ui/api``
routes only give it the server's set-up and example questions from the evaluation tasks.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Query
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"
#: The tasks whose questions the page offers (short answers: what G-NLL is calibrated on).
UI_TASKS = ("triviaqa_short", "svamp_short", "nq_open_short")
STOP = ["\n", "Question:", "Context:"]


def add_routes(app: FastAPI, service: Any, settings: Any) -> None:
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")

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
        }

    @app.get("/ui/api/examples")
    async def examples(task: str = Query("triviaqa_short"), limit: int = Query(25, ge=1, le=200)):
        if task not in UI_TASKS:
            return JSONResponse(
                {"error": f"unknown task {task!r}; choose from {list(UI_TASKS)}"}, status_code=400
            )
        try:
            return {"task": task, "examples": _examples(task, str(settings.data_dir or ""), limit)}
        except (FileNotFoundError, ValueError) as exc:
            first = str(exc).splitlines()[0]
            return JSONResponse({"error": first}, status_code=404)


@lru_cache(maxsize=8)
def _examples(task: str, data_dir: str, limit: int) -> list[dict[str, Any]]:
    from gnll.evaluation.data.tasks import get_task

    data = get_task(task).load(data_dir=data_dir or None)
    return [
        {
            "id": ex.id,
            "question": data.task.judge_question(ex),
            "prompt": data.prompt(ex),
            "answers": list(ex.answers[:5]),
        }
        for ex in data.split("eval", limit)
    ]
