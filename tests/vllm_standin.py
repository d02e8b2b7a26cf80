"""A vLLM-shaped upstream for proxy tests, computing with a real in-process transformers model.

It answers what gnll's server backend asks a vLLM server for teacher forcing: ``GET /v1/models``
(``owned_by: vllm``), ``POST /tokenize`` and ``/detokenize`` (text or chat ``messages`` through the model's template,
``add_generation_prompt``, ``continue_final_message``) and ``POST /v1/completions`` with token-id
prompts, ``echo`` and ``logprobs`` (the legacy shape vLLM returns: a leading ``null`` log-prob, then
each prompt token's log-prob under the model, then one greedy token). Numbers are the model's own
forward pass, so a test can compare what comes through the proxy with the in-process model at the
documented tolerance. ``owned_by`` may be set to another server's name to stand in for one that
cannot teacher-force.
"""

from __future__ import annotations

from typing import Any

import torch
from standin import StandIn


class VLLMResponder:
    def __init__(self, lm: Any, name: str, owned_by: str = "vllm") -> None:
        self.lm, self.name, self.owned_by = lm, name, owned_by
        self.tok = lm.tokenizer

    def _tokenize(self, body: dict[str, Any]) -> list[int]:
        if "messages" in body:
            kw = {}
            if body.get("continue_final_message"):
                kw["continue_final_message"] = True
            ids = self.tok.apply_chat_template(
                body["messages"],
                tokenize=True,
                add_generation_prompt=bool(body.get("add_generation_prompt")),
                **kw,
            )
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            return list(ids)
        return list(self.tok(body["prompt"], add_special_tokens=True)["input_ids"])

    @torch.inference_mode()
    def _echo(self, ids: list[int]) -> dict[str, Any]:
        model = self.lm.model
        logits = model(input_ids=torch.tensor([ids], device=model.device)).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        nxt = int(logp[-1].argmax())
        toks = [*ids, nxt]
        lps: list[float | None] = [None] + [
            float(logp[t - 1, toks[t]]) for t in range(1, len(toks))
        ]
        strs = [self.tok.decode([t]) for t in toks]
        tops: list[dict[str, float] | None] = [None]
        for t in range(1, len(toks)):
            best = int(logp[t - 1].argmax())
            tops.append({strs[t]: lps[t], self.tok.decode([best]): float(logp[t - 1, best])})
        return {
            "index": 0,
            "text": "".join(strs),
            "logprobs": {
                "text_offset": [0] * len(toks),
                "token_logprobs": lps,
                "tokens": strs,
                "top_logprobs": tops,
            },
            "finish_reason": "length",
            "stop_reason": None,
        }

    @torch.inference_mode()
    def _chat_one_token(self, body: dict[str, Any]) -> dict[str, Any]:
        """A one-token greedy chat answer with its top alternatives (the first-token fallback)."""
        ids = self._tokenize({"messages": body["messages"], "add_generation_prompt": True})
        model = self.lm.model
        logp = torch.log_softmax(
            model(input_ids=torch.tensor([ids], device=model.device)).logits[0, -1].float(), -1
        )
        k = int(body.get("top_logprobs") or 1)
        vals, idx = logp.topk(k)
        tops = [
            {"token": self.tok.decode([int(i)]), "logprob": float(v)}
            for v, i in zip(vals, idx, strict=True)
        ]
        first = tops[0]
        return {
            "index": 0,
            "message": {"role": "assistant", "content": first["token"]},
            "logprobs": {"content": [{**first, "top_logprobs": tops}]},
            "finish_reason": "length",
        }

    def __call__(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if method == "GET" and path.endswith("/models"):
            return 200, {"object": "list", "data": [{"id": self.name, "owned_by": self.owned_by}]}
        if path == "/detokenize":
            return 200, {"prompt": self.tok.decode(body["tokens"])}
        if path == "/tokenize":
            return 200, {"tokens": self._tokenize(body)}
        if path.endswith("/completions") and body.get("echo"):
            prompt = body["prompt"]
            ids = prompt if isinstance(prompt, list) else self._tokenize({"prompt": prompt})
            return 200, {
                "object": "text_completion",
                "model": self.name,
                "choices": [self._echo(ids)],
            }
        if path.endswith("/chat/completions"):
            return 200, {
                "object": "chat.completion",
                "model": self.name,
                "choices": [self._chat_one_token(body)],
            }
        return 404, {"error": {"message": f"no route {method} {path}"}}


def vllm_standin(lm: Any, name: str, owned_by: str = "vllm") -> StandIn:
    """A :class:`StandIn` serving ``lm`` as vLLM serves a model named ``name``."""
    return StandIn(VLLMResponder(lm, name, owned_by))
