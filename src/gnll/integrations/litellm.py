"""LiteLLM: G-NLL on the answers of the LiteLLM proxy and SDK (``pip install "gnll[litellm]"``).

**Proxy.** :class:`UncertaintyHandler` is a ``CustomLogger`` with the proxy's call hooks: it asks the
model for log-probs and greedy decoding (``async_pre_call_hook``), puts the ``uncertainty`` object
``gnll serve`` returns on every choice of a response (``async_post_call_success_hook``) and the
``X-Uncertainty-*`` headers on it (``async_post_call_response_headers_hook``), and appends it to a
stream in a last chunk (``async_post_call_streaming_iterator_hook``). ``flag`` sets
``uncertainty.abstain``; ``refuse`` replaces a likely wrong answer by the refusal (a stream is then
held back until its end); ``escalate`` answers a likely wrong answer by the larger model the
proxy's ``model_list`` names ``GNLL_ESCALATE_MODEL`` (asked through the proxy's own router, so its
keys, retries and fallbacks apply), saying who answered in ``uncertainty.answered_by``. In the
proxy's ``config.yaml``::

    environment_variables:
      GNLL_POLICY: refuse          # annotate (default), flag, refuse, escalate
      GNLL_THRESHOLD: "3.0"        # or GNLL_CALIBRATION: calibration.json
      GNLL_SERVER: vllm            # what serves the models (vllm, llama.cpp, gnll, generic)
      GNLL_ESCALATE_MODEL: large   # under escalate: a model_name of the model_list
    litellm_settings:
      callbacks: gnll.integrations.litellm.proxy_handler

Why not the router's ``fallbacks``: the proxy runs ``async_post_call_success_hook`` after the
router's call has returned, fallbacks included, so an exception raised there reaches the client as
an error; the handler makes the second call itself, on the same router.

**Tool calls.** A choice whose message carries ``tool_calls`` gets each call's record in
``uncertainty.tool_calls`` (its ``g_nll``, ``name_nll``, per-argument NLLs, ``least_certain_argument``,
``withheld``; the tokens are in the log-probs); under ``refuse`` a withheld call is removed from the
message (and from a stream, held until decided), which says which call was withheld.

**SDK.** ``litellm.callbacks = [UncertaintyHandler(on_uncertainty=...)]`` observes every
``litellm.completion`` made with ``logprobs=True`` (LiteLLM runs success callbacks after the call
returns, so they cannot change the response); :func:`score_response` scores a response directly.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

from litellm.integrations.custom_logger import CustomLogger

from gnll._util.validation import ParameterError
from gnll.backends.openai.parse import logprob_entries
from gnll.integrations.core import AnswerScorer, Scored, decoding_of, headers_for, make_policy
from gnll.policy import AbstentionPolicy, escalated, kept
from gnll.uncertainty import Uncertainty

__all__ = ["UncertaintyHandler", "proxy_handler", "score_response"]

_CLIENT_LOGPROBS = "gnll_client_logprobs"  # in the request's metadata: what the client asked for
#: The request fields an escalation passes on to the larger model (the rest are the proxy's own).
_ESCALATED_FIELDS = (
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "n",
    "seed",
    "tools",
    "tool_choice",
    "response_format",
)


def _plain(obj: Any) -> Any:
    if obj is None or isinstance(obj, (dict, list, str, int, float, bool)):
        return obj
    dump = getattr(obj, "model_dump", None)
    return dump() if dump is not None else dict(obj)


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(key, default)
    return getattr(obj, key, default)


def score_response(
    response: Any, scorer: AnswerScorer, *, decoding: str = "greedy", stop: Any = None
) -> list[Scored]:
    """Score every choice of a LiteLLM ``ModelResponse`` (or an OpenAI chat body as a dict)."""
    out = []
    for i, choice in enumerate(_get(response, "choices") or []):
        message = _get(choice, "message")
        extra = _get(choice, "provider_specific_fields") or {}
        kwargs: dict[str, Any] = {}
        if isinstance(extra, dict) and "stop_reason" in extra:
            kwargs["stop_reason"] = extra["stop_reason"]
        out.append(
            scorer.score(
                _get(message, "content") if message is not None else _get(choice, "text"),
                _plain(_get(choice, "logprobs")),
                finish_reason=_get(choice, "finish_reason"),
                decoding=decoding,
                stop=stop,
                where=f"choice {i}",
                tool_calls=_get(message, "tool_calls") if message is not None else None,
                **kwargs,
            )
        )
    return out


def _withhold(choice: Any, scored: Scored) -> None:
    """Replace a refused choice's answer by the refusal, its tool calls (withheld) dropped."""
    choice.message.content = scored.text
    for holder in (choice, choice.message):
        # an upstream gnll serve's own record of the answer (LiteLLM keeps a choice's unknown
        # fields there) holds its tokens
        extra = _get(holder, "provider_specific_fields")
        if isinstance(extra, dict):
            extra.pop("uncertainty", None)
    if _get(choice.message, "tool_calls"):
        choice.message.tool_calls = None
        choice.finish_reason = scored.finish_reason


def _add_call_deltas(calls: dict[int, dict[str, Any]], deltas: Any) -> None:
    """Add a stream delta's ``tool_calls`` pieces to the calls by their index (name and
    arguments are spelled over several deltas)."""
    for d in deltas or []:
        k = _get(d, "index", 0) or 0
        fn = _get(d, "function")
        call = calls.setdefault(k, {"name": "", "arguments": ""})
        call["name"] += _get(fn, "name") or ""
        call["arguments"] += _get(fn, "arguments") or ""


class UncertaintyHandler(CustomLogger):
    """The ``uncertainty`` object on LiteLLM's answers (proxy hooks and SDK logger; see the module).

    Parameters are those of :func:`gnll.integrations.langchain.with_uncertainty`; without any, they
    are read from the environment when first needed (``GNLL_POLICY``, ``GNLL_THRESHOLD``,
    ``GNLL_CALIBRATION``, ``GNLL_MIN_P_CORRECT``, ``GNLL_REFUSAL``, ``GNLL_SERVER``,
    ``GNLL_ESCALATE_MODEL``, ``GNLL_TOOL_ARGUMENT_THRESHOLD``), so that the proxy's ``config.yaml`` configures :data:`proxy_handler`.
    ``escalate_model``: under ``policy="escalate"``, the ``model_name`` (of the proxy's
    ``model_list``) that answers instead when the local answer is likely wrong. ``on_uncertainty(record, kwargs)``
    receives every SDK answer's record; ``records`` keeps the last 1000.
    """

    def __init__(
        self,
        *,
        policy: AbstentionPolicy | str | None = None,
        calibration: str | Path | None = None,
        threshold: float | None = None,
        min_p_correct: float | None = None,
        refusal: str | None = None,
        server: str | None = None,
        escalate_model: str | None = None,
        tool_argument_threshold: float | None = None,
        top_logprobs: int = 1,
        on_uncertainty: Callable[[Uncertainty, dict[str, Any]], None] | None = None,
    ) -> None:
        super().__init__()
        self._options = dict(
            policy=policy,
            calibration=calibration,
            threshold=threshold,
            min_p_correct=min_p_correct,
            refusal=refusal,
            server=server,
            escalate_model=escalate_model,
            tool_argument_threshold=tool_argument_threshold,
        )
        self.top_logprobs = max(1, int(top_logprobs))
        self.on_uncertainty = on_uncertainty
        self.records: list[Uncertainty] = []
        self._scorer: AnswerScorer | None = None

    @property
    def scorer(self) -> AnswerScorer:
        if self._scorer is None:
            o, env = self._options, os.environ.get
            threshold = o["threshold"] if o["threshold"] is not None else env("GNLL_THRESHOLD")
            min_p = (
                o["min_p_correct"] if o["min_p_correct"] is not None else env("GNLL_MIN_P_CORRECT")
            )
            arg_t = o["tool_argument_threshold"]
            arg_t = arg_t if arg_t is not None else env("GNLL_TOOL_ARGUMENT_THRESHOLD")
            mode = o["policy"] or env("GNLL_POLICY") or "annotate"
            if mode == "escalate" and not self.escalate_model:
                raise ValueError(
                    "policy 'escalate' needs the larger model: set GNLL_ESCALATE_MODEL to a "
                    "model_name of the proxy's model_list"
                )
            self._scorer = AnswerScorer(
                policy=make_policy(
                    mode,
                    calibration=o["calibration"] or env("GNLL_CALIBRATION") or None,
                    threshold=None if threshold in (None, "") else float(threshold),
                    min_p_correct=None if min_p in (None, "") else float(min_p),
                    refusal=o["refusal"] or env("GNLL_REFUSAL") or None,
                    escalate=True,
                ),
                server=o["server"] or env("GNLL_SERVER") or "generic",
                tool_argument_threshold=None if arg_t in (None, "") else float(arg_t),
            )
        return self._scorer

    @property
    def escalate_model(self) -> str | None:
        return self._options["escalate_model"] or os.environ.get("GNLL_ESCALATE_MODEL") or None

    async def _escalate(self, data: dict) -> Any:
        """The larger model's answer to the same request, through the proxy's router (the SDK's
        ``litellm.acompletion`` outside a proxy), with log-probs for its own G-NLL."""
        request = {k: data[k] for k in _ESCALATED_FIELDS if data.get(k) is not None}
        request = self.scorer.policy.pin(request, top_logprobs=self.top_logprobs)
        try:
            from litellm.proxy.proxy_server import llm_router
        except ImportError:  # the SDK without the proxy's extras
            llm_router = None
        if llm_router is not None:
            return await llm_router.acompletion(model=self.escalate_model, **request)
        import litellm

        return await litellm.acompletion(model=self.escalate_model, **request)

    async def _escalated(
        self, data: dict, local_model: str, local: list[tuple[str, Scored]]
    ) -> tuple[Any, list[Scored]] | str:
        """Ask the larger model; its response and scored choices, or why it failed."""
        try:
            up = await self._escalate(data)
            scored = score_response(
                up, AnswerScorer(server=self.scorer.server), stop=data.get("stop")
            )
        except Exception as exc:  # noqa: BLE001 - any failure keeps the local answer
            return f"{type(exc).__name__}: {exc}".splitlines()[0]
        text, first = local[0]
        records = escalated(
            [s.uncertainty for s in scored],
            answered_by=self.escalate_model or "",
            local=first.uncertainty,
            local_text=text,
            local_model=local_model,
        )
        return up, [
            Scored(r, s.text, s.finish_reason) for r, s in zip(records, scored, strict=True)
        ]

    @staticmethod
    def _kept(scored: list[Scored], local_model: str, error: str | None = None) -> list[Scored]:
        records = kept([s.uncertainty for s in scored], local_model, error)
        return [Scored(r, s.text, s.finish_reason) for r, s in zip(records, scored, strict=True)]

    # ------------------------------------------------------------------ proxy hooks
    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict, call_type: Any
    ) -> dict:
        """Ask for log-probs (remembering whether the client did) and greedy decoding."""
        if "messages" not in data:  # embeddings, images, ...: nothing to score
            return data
        try:
            pinned = self.scorer.policy.pin(data, top_logprobs=self.top_logprobs)
        except ParameterError as exc:
            from fastapi import HTTPException

            raise HTTPException(status_code=400, detail=exc.problem) from None
        metadata = data.setdefault("metadata", {})
        metadata[_CLIENT_LOGPROBS] = bool(data.get("logprobs"))
        data.update(pinned)  # the proxy reads the dict it passed in
        return data

    def _decoding(self, data: dict) -> str:
        return decoding_of(data.get("temperature"))

    async def async_post_call_success_hook(
        self, data: dict, user_api_key_dict: Any, response: Any
    ) -> Any:
        """Put ``uncertainty`` on every choice; under ``refuse`` replace a refused answer."""
        if not _get(response, "choices"):
            return response
        scored = score_response(
            response, self.scorer, decoding=self._decoding(data), stop=data.get("stop")
        )
        keep = (data.get("metadata") or {}).get(_CLIENT_LOGPROBS, True)
        if self.scorer.policy.mode == "escalate":
            local_model = data.get("model") or ""
            if not any(s.uncertainty.abstain for s in scored):
                scored = self._kept(scored, local_model)
            else:
                texts = [_get(_get(c, "message"), "content") or "" for c in response.choices]
                out = await self._escalated(
                    data, local_model, list(zip(texts, scored, strict=True))
                )
                if isinstance(out, str):
                    scored = self._kept(scored, local_model, out)
                else:
                    response, scored = out
        for choice, s in zip(response.choices, scored, strict=True):
            choice.uncertainty = s.uncertainty.to_json()
            if s.refused:
                _withhold(choice, s)
            if s.refused or not keep:
                choice.logprobs = None
        return response

    async def async_post_call_response_headers_hook(
        self,
        data: dict,
        user_api_key_dict: Any,
        response: Any,
        request_headers: dict[str, str] | None = None,
        litellm_call_info: dict[str, object] | None = None,
    ) -> dict[str, str] | None:
        """``X-Uncertainty-*`` headers of a whole response (a stream's come in its last chunk)."""
        choices = _get(response, "choices")
        if not choices or any(_get(c, "uncertainty") is None for c in choices):
            return None
        return headers_for([Uncertainty.model_validate(_get(c, "uncertainty")) for c in choices])

    async def async_post_call_streaming_iterator_hook(
        self, user_api_key_dict: Any, response: Any, request_data: dict
    ) -> AsyncGenerator[Any, None]:
        """Relay the stream, then one chunk per choice with its ``uncertainty``."""
        if "messages" not in request_data:
            async for chunk in response:
                yield chunk
            return
        policy = self.scorer.policy
        # a sampled answer has no G-NLL to escalate on (as in gnll serve): it streams live
        greedy = self._decoding(request_data) == "greedy"
        keep = (request_data.get("metadata") or {}).get(_CLIENT_LOGPROBS, True)
        texts: dict[int, list[str]] = {}
        logprobs: dict[int, list[Any]] = {}
        finish: dict[int, Any] = {}
        calls: dict[int, dict[int, dict[str, Any]]] = {}  # choice -> call index -> name, arguments
        last: list[Any] = []

        async def taking() -> AsyncGenerator[Any, None]:
            async for chunk in response:
                last[:] = [chunk]
                for choice in _get(chunk, "choices") or []:
                    i = _get(choice, "index", 0) or 0
                    delta = _get(choice, "delta")
                    texts.setdefault(i, []).append(_get(delta, "content") or "")
                    _add_call_deltas(calls.setdefault(i, {}), _get(delta, "tool_calls"))
                    lp = _plain(_get(choice, "logprobs"))
                    if isinstance(lp, dict):
                        logprobs.setdefault(i, []).extend(logprob_entries(lp))
                    if _get(choice, "finish_reason") is not None:
                        finish[i] = _get(choice, "finish_reason")
                        choice.finish_reason = None  # the choice finishes in our last chunk
                    if not keep:
                        choice.logprobs = None
                yield chunk

        async def settle(unsent: list[Any]) -> AsyncGenerator[Any, None]:
            if not last:
                return
            closing = []
            for i in sorted(texts):
                s = self.scorer.score(
                    "".join(texts[i]),
                    {"content": logprobs.get(i, [])},
                    finish_reason=finish.get(i),
                    decoding=self._decoding(request_data),
                    stop=request_data.get("stop"),
                    where=f"choice {i}",
                    tool_calls=[c for _, c in sorted(calls.get(i, {}).items())],
                )
                closing.append((i, s))
            replaced: dict[int, str] = {}  # choice -> the text that replaces the held answer
            if policy.mode == "escalate":
                local_model = request_data.get("model") or ""
                scored = [s for _, s in closing]
                if not policy.holds(greedy=greedy) or not any(
                    s.uncertainty.abstain for s in scored
                ):
                    scored = self._kept(scored, local_model)
                else:
                    local = [("".join(texts[i]), s) for i, s in closing]
                    out = await self._escalated(request_data, local_model, local)
                    if isinstance(out, str):
                        scored = self._kept(scored, local_model, out)
                    else:
                        _, scored = out
                        for (i, _), s in zip(closing, scored, strict=True):
                            replaced[i] = s.text
                            finish[i] = s.finish_reason
                closing = [(i, s) for (i, _), s in zip(closing, scored, strict=True)]
            for i, s in closing:
                if s.refused:  # the refusal alone (no held chunk, so no withheld call's delta)
                    replaced[i] = s.text
                    if calls.get(i):
                        finish[i] = s.finish_reason  # "stop": no call follows
            if not replaced:  # kept: the held chunks (all under refuse/escalate, else the last)
                for chunk in unsent:
                    yield chunk
            from litellm.types.utils import Delta, ModelResponseStream, StreamingChoices

            for i, s in closing:
                content = replaced.get(i)
                choice = StreamingChoices(
                    index=i,
                    delta=Delta(content=content, role="assistant"),
                    finish_reason=finish.get(i),
                )
                choice.uncertainty = s.uncertainty.to_json()
                yield ModelResponseStream(
                    id=_get(last[0], "id"),
                    created=_get(last[0], "created"),
                    model=_get(last[0], "model"),
                    choices=[choice],
                )

        async for out in policy.awrap(taking(), settle, greedy=greedy):
            yield out

    # ------------------------------------------------------------------ SDK logger
    def _observe(self, kwargs: dict[str, Any], response: Any) -> None:
        params = kwargs.get("optional_params") or {}
        if not params.get("logprobs") and not kwargs.get("logprobs"):
            return
        choices = _get(response, "choices") or []
        if choices and all(_get(c, "uncertainty") is not None for c in choices):
            # Scored once already, by the proxy's call hooks (which then removed the log-probs
            # the client did not ask for): record those numbers, never score a second time.
            for c in choices:
                self._record(Uncertainty.model_validate(_get(c, "uncertainty")), kwargs)
            return
        if choices and all(_get(c, "logprobs") is None for c in choices):
            return  # the proxy's stream, reassembled without log-probs: scored in its hook
        for s in score_response(
            response,
            self.scorer,
            decoding=decoding_of(params.get("temperature")),
            stop=params.get("stop"),
        ):
            self._record(s.uncertainty, kwargs)

    def _record(self, record: Uncertainty, kwargs: dict[str, Any]) -> None:
        self.records = [*self.records[-999:], record]
        if self.on_uncertainty is not None:
            self.on_uncertainty(record, kwargs)

    def log_success_event(self, kwargs, response_obj, start_time, end_time):  # noqa: ANN001
        self._observe(kwargs, response_obj)

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):  # noqa: ANN001
        self._observe(kwargs, response_obj)


#: The handler a proxy's ``config.yaml`` names (``callbacks: gnll.integrations.litellm.proxy_handler``),
#: configured by the ``GNLL_*`` environment variables.
proxy_handler = UncertaintyHandler()
