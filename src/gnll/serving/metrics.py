"""Prometheus metrics of one server (a registry per app, so tests can run several side by side)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gnll.serving.observers import Answered
from gnll.uncertainty import Uncertainty

#: G-NLL buckets in nats: short confident answers sit below 1, long or unsure ones reach tens.
G_NLL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 12.0, 20.0, 40.0, float("inf"))
LATENCY_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.0,
    4.0,
    8.0,
    16.0,
    32.0,
    64.0,
    float("inf"),
)


class Metrics:
    """Request counts and latencies, answers' G-NLL, abstentions, and the engine's batch sizes."""

    content_type = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "gnll_requests",
            "HTTP requests by endpoint and status",
            ["endpoint", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "gnll_request_latency_seconds",
            "Request latency",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.g_nll = Histogram(
            "gnll_answer_g_nll", "G-NLL of greedy answers (nats)", buckets=G_NLL_BUCKETS, registry=r
        )
        self.answers = Counter("gnll_answers", "Answers by decoding", ["decoding"], registry=r)
        self.api_answers = Counter(
            "gnll_api_answers",
            "Answers by the API they were asked through (chat.completions, completions, "
            "responses, messages)",
            ["api"],
            registry=r,
        )
        self.abstentions = Counter(
            "gnll_abstentions", "Greedy answers the policy marked abstain=true", registry=r
        )
        self.abstention_rate = Gauge(
            "gnll_abstention_rate",
            "Abstentions / greedy answers with a decision, since start",
            registry=r,
        )
        self.escalations = Counter(
            "gnll_escalations",
            "Answers sent to the larger model under --policy escalate (failed attempts included)",
            ["outcome"],
            registry=r,
        )
        self.early_decisions = Counter(
            "gnll_early_decisions",
            "Answers refused or escalated at an exact early decision, before their end (--early)",
            ["action"],
            registry=r,
        )
        self.early_tokens_saved = Counter(
            "gnll_early_tokens_saved",
            "Tokens not generated thanks to early decisions (against each request's max_tokens)",
            registry=r,
        )
        self.batch_size = Histogram(
            "gnll_batch_prompts",
            "Prompts per batched run: a generate call, or a continuous decoding loop from start to idle",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
            registry=r,
        )
        self.batch_seconds = Histogram(
            "gnll_batch_seconds",
            "Seconds per model.generate call",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tool_calls = Counter(
            "gnll_tool_calls",
            "Tool calls of in-process answers, by outcome (sent, or withheld by the policy)",
            ["outcome"],
            registry=r,
        )
        self.tool_argument_nll = Histogram(
            "gnll_tool_call_max_argument_nll",
            "Each tool call's least certain argument value's NLL (nats)",
            buckets=G_NLL_BUCKETS,
            registry=r,
        )
        self._decided = 0
        self._abstained = 0

    def observe_request(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def observe_answer(self, record: Uncertainty) -> None:
        self.answers.labels(record.decoding).inc()
        if record.escalated:
            self.escalations.labels("answered").inc()
        elif record.escalation_error:
            self.escalations.labels("failed").inc()
        early = record.early_decision
        if early is not None:
            self.early_decisions.labels("escalate" if record.escalated else "refuse").inc()
            self.early_tokens_saved.inc(max(0, early.tokens_saved or 0))
        if record.g_nll is not None:
            self.g_nll.observe(record.g_nll)
        for call in record.tool_calls or []:
            self.tool_calls.labels("withheld" if call.get("withheld") else "sent").inc()
            if call.get("max_argument_nll") is not None:
                self.tool_argument_nll.observe(call["max_argument_nll"])
        if record.abstain is not None:
            self._decided += 1
            if record.abstain:
                self._abstained += 1
                self.abstentions.inc()
            self.abstention_rate.set(self._abstained / self._decided)

    def answered(self, event: Answered) -> None:
        """Observe every answer of a request (:mod:`gnll.serving.observers`)."""
        for record in event.records:
            self.observe_answer(record)
        if event.records:
            self.api_answers.labels(str(event.entry.get("api", "other"))).inc(len(event.records))

    def observe_batch(self, prompts: int, seconds: float) -> None:
        self.batch_size.observe(prompts)
        self.batch_seconds.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
