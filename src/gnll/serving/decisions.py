"""``POST /v1/decisions``: typed decisions with exact option probabilities, on either service.

In-process, the served model scores every option of every question (:func:`gnll.decide`).
Through the proxy, the upstream must teacher-force (vLLM: ``echo`` with prompt log-probs on
``/v1/completions``, and ``/tokenize``); an upstream that cannot (llama.cpp, llama-cpp-python,
OpenAI) is refused in one line naming what is missing, unless the request asks for
``first_token``: each option's first token is then read from the upstream's top alternatives at
the answer position, and every answer says ``method: first-token``.

With a decisions calibration (``gnll serve --calibration FILE``, written by ``gnll calibrate
--decisions``) each answer of a calibrated type carries its calibrated ``p_correct`` and the
``guarantee`` of its threshold, and an answer below the threshold is a refusal that says so.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from gnll.backends.base import GenerationConfig, Model, StreamingModel
from gnll.backends.openai import OpenAICompatModel
from gnll.scoring.api import ScoringError
from gnll.scoring.decisions import (
    Decision,
    DecisionAnswer,
    DecisionError,
    answer_from_logprobs,
    decide,
    first_token_logprobs,
    input_messages,
    parse_questions,
    question_messages,
)
from gnll.serving.errors import HTTPError
from gnll.serving.protocol.decisions import DecisionRequest, DecisionResponse, Usage
from gnll.serving.service import Service
from gnll.serving.settings import ServeSettings

if TYPE_CHECKING:
    from gnll.calibration.decisions import DecisionCalibration

__all__ = ["DecisionsService", "add_routes"]

#: How many alternatives the first-token fallback asks the upstream for.
FIRST_TOKEN_TOP = 20


class DecisionsService:
    """Answers decision requests with the app's service: its in-process model, or its upstream."""

    def __init__(self, service: Service, calibration: DecisionCalibration | None = None) -> None:
        self.service = service
        self.calibration = calibration
        self._upstream_model: Model | None = None

    def _local_model(self) -> Model | None:
        local = getattr(self.service, "local", self.service)  # a cascade answers with its local
        model = getattr(local, "model", None)
        return model if isinstance(model, Model) else None

    async def _proxy_model(self, requested: str) -> Model:
        proxy = getattr(self.service, "local", self.service)
        scoring_model = getattr(proxy, "scoring_model", None)
        if scoring_model is None:
            raise HTTPError(500, "this service cannot answer decisions", "server_error")
        model: Model = await scoring_model(requested)
        return model

    async def answer(self, req: DecisionRequest) -> DecisionResponse:
        """The response to one request (an :class:`HTTPError` for a request that cannot be served)."""
        try:
            questions = parse_questions([q.model_dump(exclude_none=True) for q in req.questions])
            base = input_messages(req.input)
        except DecisionError as exc:
            raise HTTPError(400, str(exc), "invalid_request_error") from None
        local = self._local_model()
        if local is not None:
            check = getattr(getattr(self.service, "local", self.service), "check_model", None)
            if check is not None:
                check(req.model)
            model = local
        else:
            model = await self._proxy_model(req.model)
        first_token = False
        if model.capabilities.missing(["scoring"]):
            if not req.first_token:
                raise HTTPError(
                    400,
                    f"the upstream ({self._server()}) cannot teacher-force: it returns no log-probs "
                    "for prompt tokens (no `echo`/`prompt_logprobs` on /v1/completions), so an "
                    "option's exact probability cannot be computed; serve the model with vLLM or "
                    'in-process, or send "first_token": true for first-token scores (labelled so)',
                    "invalid_request_error",
                    "model",
                    "cannot_teacher_force",
                )
            if not isinstance(model, OpenAICompatModel):
                raise HTTPError(
                    400,
                    f"{model.name} cannot teacher-force and is not an OpenAI-compatible upstream "
                    "whose first-token scores could be read",
                    "invalid_request_error",
                    "first_token",
                )
            first_token = True
        try:
            if first_token:
                assert isinstance(model, OpenAICompatModel)
                decision = await anyio.to_thread.run_sync(
                    _first_token_decision, model, base, questions, req.min_mass
                )
            else:
                decision = await anyio.to_thread.run_sync(
                    lambda: decide(model, base, questions, min_mass=req.min_mass)
                )
        except (DecisionError, ScoringError) as exc:
            raise HTTPError(400, str(exc), "invalid_request_error") from None
        answers = [self._calibrated(a) for a in decision.answers]
        prompt_tokens = _prompt_tokens(model, base, questions)
        tokens = prompt_tokens + decision.scored_tokens
        return DecisionResponse.model_validate(
            {
                "model": decision.model,
                "answers": [a.to_dict() for a in answers],
                "usage": Usage(input_tokens=tokens, total_tokens=tokens),
            }
        )

    def _server(self) -> str:
        """What the upstream is (its kind, as the service recognised it)."""
        facts = self.service.describe()
        return str(facts.get("server") or facts.get("upstream") or "unknown")

    def _calibrated(self, answer: DecisionAnswer) -> DecisionAnswer:
        """The answer with its calibrated P(correct) and guarantee; refused below the threshold."""
        if self.calibration is None:
            return answer
        calibrated: DecisionAnswer = self.calibration.apply(answer)
        return calibrated


def _prompt_tokens(model: Model, base: list[dict[str, str]], questions: list[Any]) -> int:
    """The questions' prompt tokens, when the model can count them (0 otherwise)."""
    if not isinstance(model, StreamingModel):
        return 0
    from gnll.backends.base import ChatPrompt

    prompts = [ChatPrompt.of(question_messages(base, q)) for q in questions if not q.unanswerable]
    if not prompts:
        return 0
    return sum(len(ids) for ids in model.encode(prompts))


def _first_token_decision(
    model: OpenAICompatModel, base: list[dict[str, str]], questions: list[Any], min_mass: float
) -> Decision:
    """Decisions from the first answer token's top alternatives (an upstream that cannot
    teacher-force, when the request asks): one one-token greedy request per question."""
    from gnll.backends.base import ChatPrompt

    answers = []
    config = GenerationConfig.greedy(max_new_tokens=1)
    for q in questions:
        if q.unanswerable:
            answers.append(
                DecisionAnswer("refusal", q.type, q.name, "first-token", reason=q.unanswerable)
            )
            continue
        prompt = ChatPrompt.of(question_messages(base, q))
        [raw] = model.request_raw(prompt, config, top_logprobs=FIRST_TOKEN_TOP, endpoint="chat")
        tops = raw.tops[0] if raw.tops else {}
        lps, missing = first_token_logprobs([o.text for o in q.options], tops)
        if missing:
            answers.append(
                DecisionAnswer(
                    "refusal",
                    q.type,
                    q.name,
                    "first-token",
                    reason=f"the first token of option(s) {', '.join(map(repr, missing))} is not "
                    f"among the upstream's top {len(tops)} alternatives",
                )
            )
            continue
        answers.append(answer_from_logprobs(q, lps, method="first-token", min_mass=min_mass))
    return Decision(answers, model.name)


def add_routes(
    app: FastAPI,
    service: Service,
    settings: ServeSettings,
    calibration: DecisionCalibration | None = None,
) -> DecisionsService:
    """Register ``POST /v1/decisions`` on the app (its auth, limits and error envelope apply)."""
    from gnll.serving.app import read_body

    decisions = DecisionsService(service, calibration)

    @app.post("/v1/decisions")
    async def decisions_route(request: Request) -> JSONResponse:
        raw = await read_body(request, settings.max_request_bytes, settings.body_timeout)
        try:
            req = DecisionRequest.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err.get("loc", ()))
            raise HTTPError(
                400, f"invalid request: {where}: {err.get('msg')}", "invalid_request_error", where
            ) from None
        response = await decisions.answer(req)
        request.state.log.update(
            model=response.model,
            questions=len(response.answers),
            refusals=sum(a.type == "refusal" for a in response.answers),
        )
        body = response.to_json()
        if not all(_finite(a) for a in body["answers"]):
            raise HTTPError(500, "a decision came out as a non-finite number", "server_error")
        return JSONResponse(body)

    return decisions


def _finite(answer: dict[str, Any]) -> bool:
    numbers = [answer.get(k) for k in ("probability", "confidence", "score", "mass")]
    numbers += [o["probability"] for o in answer.get("probabilities", [])]
    return all(x is None or math.isfinite(x) for x in numbers)
