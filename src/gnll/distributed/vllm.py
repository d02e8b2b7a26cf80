"""gnll's arithmetic on ``ray.data.llm``'s vLLM processor: score given answers, or generate greedily.

A GPU cluster that already runs ``build_processor(vLLMEngineProcessorConfig(...))`` keeps its
vLLM stage; these processors put gnll around it::

    from ray.data.llm import build_processor, vLLMEngineProcessorConfig
    from gnll.distributed.vllm import VllmScoring

    gs = VllmScoring.from_pretrained("Qwen/Qwen2.5-7B-Instruct")
    proc = build_processor(
        vLLMEngineProcessorConfig(model_source="Qwen/Qwen2.5-7B-Instruct", tensor_parallel_size=2),
        preprocess=gs.preprocess, postprocess=gs.postprocess)
    proc(ray.data.read_parquet("logs/")).write_parquet("scored/")

:class:`VllmScoring` sends prompt + answer as the prompt, tokenised here exactly as gnll's own
backend tokenises it (``tokenized_prompt``), with ``prompt_logprobs`` and ``max_tokens=1``; its
``postprocess`` slices the answer's tokens out of vLLM's ``prompt_logprobs`` and returns the
columns ``gnll score`` writes (``nll``, ``ln_nll``, ``num_tokens``, ``is_greedy``,
``greedy_stops``, ``boundary_merged``, ``error``). :class:`VllmGreedy` asks for the greedy answer
with ``logprobs`` and splits it into answer and terminator as gnll's greedy stage does
(``answer``, ``g_nll``, ``ln_g_nll``, ``num_tokens``, ``finish_reason``, ``stop_sequence``,
``terminator_logprobs``, ``error``). vLLM's output rows (``ray.data.llm``'s ``vLLMOutputData``)
carry ``prompt_token_ids``, ``prompt_logprobs`` and ``logprobs`` as lists of
``{token_id: {"logprob", "rank", "decoded_token"}}``, and ``generated_tokens``/``generated_text``.
"""

from __future__ import annotations

from typing import Any

from gnll import measures as M
from gnll.backends.base import GenerationConfig, ScoredAnswer
from gnll.backends.prompting import DEFAULT_MAX_NEW_TOKENS
from gnll.scoring.api import check_scored, join_answer
from gnll.scoring.rows import Item, to_item

__all__ = ["VllmGreedy", "VllmScoring"]

#: Columns of vLLM's stage (and of these processors' requests) that are not the user's.
_ENGINE_FIELDS = {
    "prompt", "prompt_token_ids", "tokenized_prompt", "sampling_params", "generated_tokens",
    "generated_text", "num_generated_tokens", "num_input_tokens", "logprobs", "prompt_logprobs",
    "metrics", "embeddings", "time_taken_llm", "batch_uuid", "request_id", "params",
}  # fmt: skip


def _entry(position: Any, token_id: int) -> dict[str, Any] | None:
    """vLLM's record of ``token_id`` at one position (keys are ints, or strings after Arrow)."""
    if not position:
        return None
    return position.get(token_id, position.get(str(token_id)))


def _user_fields(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in _ENGINE_FIELDS and not k.startswith("gnll_")}


class _Templates:
    """gnll's side of a vLLM stage: the HF backend's tokenizer side of the model vLLM serves."""

    def __init__(
        self, tokenizer: Any, *, chat_template: bool, eos_ids: set[int], long: bool
    ) -> None:
        from gnll.backends import tokenizer_side

        self.side = tokenizer_side(tokenizer, chat_template=chat_template, eos_ids=eos_ids)
        self.eos_ids, self.long = self.side.eos_ids, long

    @classmethod
    def from_pretrained(cls, source: str, *, chat_template: bool | None = None, **kw: Any) -> Any:
        """Read the tokenizer (and EOS ids) of ``source``, the model vLLM serves; no weights."""
        from gnll.backends import tokenizer_side

        side = tokenizer_side(source, chat_template=chat_template)
        return cls(side.tokenizer, chat_template=side.chat_template, eos_ids=side.eos_ids, **kw)

    @classmethod
    def from_model(cls, model: Any, **kw: Any) -> Any:
        """The tokenizer side of a loaded gnll HF model (tests; a CPU check of a GPU run)."""
        from gnll.backends import tokenizer_side

        side = tokenizer_side(model)
        return cls(side.tokenizer, chat_template=side.chat_template, eos_ids=side.eos_ids, **kw)

    def item(self, row: dict[str, Any], raw_prompt: bool) -> Item | str:
        return to_item(
            0,
            row,
            long=self.long,
            render_messages=self.side.render_chat if self.side.chat_template else None,
            raw_prompt=raw_prompt,
        )

    def _placeholder(self, row: dict[str, Any], error: str) -> dict[str, Any]:
        # vLLM needs a prompt on every row; a bad row sends one token and keeps its error
        return {**row, "tokenized_prompt": [self.side.placeholder_id],
                "sampling_params": {"max_tokens": 1}, "gnll_error": error}  # fmt: skip


class VllmScoring(_Templates):
    """Score the ``answer`` of each row on vLLM, with gnll's tokenisation and arithmetic.

    Rows are ``gnll score`` input rows (``answer`` and ``question``/``prompt``/``messages``).
    ``long``, ``raw_prompt`` and ``verbatim`` mean what they mean for ``gnll score``.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        chat_template: bool,
        eos_ids: set[int],
        long: bool = False,
        raw_prompt: bool = False,
        verbatim: bool = False,
    ) -> None:
        super().__init__(tokenizer, chat_template=chat_template, eos_ids=eos_ids, long=long)
        self.raw_prompt, self.verbatim = raw_prompt, verbatim
        self.end_ids = self.side.end_ids

    def preprocess(self, row: dict[str, Any]) -> dict[str, Any]:
        """The request: prompt + answer as token ids, ``prompt_logprobs=1``, ``max_tokens=1``."""
        item = self.item(row, self.raw_prompt)
        if isinstance(item, str):
            return self._placeholder(row, item)
        text = item.prompt if item.raw_prompt else self.side.render(item.prompt)
        answer = item.answer if self.verbatim else join_answer(text, item.answer)
        prompt_ids, answer_ids, merged = self.side.encode_answer(text, answer)
        return {
            **row,
            "tokenized_prompt": prompt_ids + answer_ids,
            "sampling_params": {
                "max_tokens": 1,
                "temperature": 0.0,
                "prompt_logprobs": 1,
                "logprobs": 1,
            },  # fmt: skip
            "gnll_answer_start": len(prompt_ids),
            "gnll_boundary_merged": merged,
        }

    def postprocess(self, row: dict[str, Any]) -> dict[str, Any]:
        """``gnll score``'s columns from vLLM's ``prompt_logprobs`` of the answer's tokens."""
        out = _user_fields(row)
        empty = dict.fromkeys(("nll", "ln_nll", "num_tokens", "is_greedy", "greedy_stops"))
        if row.get("gnll_error"):
            return {**out, **empty, "boundary_merged": None, "error": row["gnll_error"]}
        try:
            s = self.scored(row)
        except ValueError as e:
            return {**out, **empty, "boundary_merged": None, "error": f"cannot score: {e}"}
        return {
            **out,
            "nll": s.nll, "ln_nll": s.ln_nll, "num_tokens": s.num_tokens,
            "is_greedy": s.is_greedy, "greedy_stops": s.greedy_stops,
            "boundary_merged": s.boundary_merged, "error": None,
        }  # fmt: skip

    def scored(self, row: dict[str, Any]) -> ScoredAnswer:
        """The :class:`~gnll.backends.base.ScoredAnswer` of one vLLM output row."""
        ids = [int(t) for t in row["prompt_token_ids"]]
        start = int(row["gnll_answer_start"])
        positions = row.get("prompt_logprobs") or []
        if len(positions) < len(ids):
            raise ValueError(
                f"vLLM returned prompt_logprobs for {len(positions)} of {len(ids)} tokens: "
                "request prompt_logprobs (the preprocess does)"
            )
        values, greedy = [], True
        for t in range(start, len(ids)):
            e = _entry(positions[t], ids[t])
            if e is None:
                raise ValueError(f"no log-prob for answer token {t - start} in prompt_logprobs")
            v = float(e["logprob"])
            values.append(v)  # checked (and round-off clamped) below, as gnll score checks them
            rank = e.get("rank")
            best = max(float(x["logprob"]) for x in positions[t].values())
            greedy &= rank == 1 if rank is not None else v >= best
        nxt = row.get("generated_tokens")
        item = ScoredAnswer(
            text=str(row.get("answer", "")),
            token_ids=ids[start:],
            tokens=[self.side.decode([i]) for i in ids[start:]],
            token_logprobs=values,
            is_greedy=greedy,
            greedy_stops=None if nxt is None or not len(nxt) else int(nxt[0]) in self.end_ids,
            boundary_merged=bool(row.get("gnll_boundary_merged")),
        )
        return check_scored(item, item.text)


class VllmGreedy(_Templates):
    """Generate each row's greedy answer on vLLM; G-NLL and the terminator split as gnll's greedy stage."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        chat_template: bool,
        eos_ids: set[int],
        long: bool = False,
        max_new_tokens: int | None = None,
    ) -> None:
        super().__init__(tokenizer, chat_template=chat_template, eos_ids=eos_ids, long=long)
        self.config = GenerationConfig.greedy(
            max_new_tokens=max_new_tokens or DEFAULT_MAX_NEW_TOKENS[long]
        )

    def preprocess(self, row: dict[str, Any]) -> dict[str, Any]:
        """The request: the rendered prompt's ids, temperature 0, ``logprobs=1``, gnll's stops."""
        item = self.item({"answer": "-", **row}, raw_prompt=False)
        if isinstance(item, str):
            return self._placeholder(row, item)
        text = item.prompt if item.raw_prompt else self.side.render(item.prompt)
        return {
            **row,
            "tokenized_prompt": self.side.encode(text),
            "sampling_params": {
                "max_tokens": self.config.max_new_tokens,
                "temperature": 0.0,
                "logprobs": 1,
                "stop": list(self.config.stop),
                "include_stop_str_in_output": False,
            },  # fmt: skip
        }

    def postprocess(self, row: dict[str, Any]) -> dict[str, Any]:
        """The greedy answer's columns (``answer``, ``g_nll``, ...) from vLLM's ``logprobs``."""
        out = _user_fields(row)
        cols = ("answer", "g_nll", "ln_g_nll", "num_tokens", "finish_reason", "stop_sequence")
        if row.get("gnll_error"):
            return {**out, **dict.fromkeys(cols), "terminator_logprobs": None,
                    "error": row["gnll_error"]}  # fmt: skip
        try:
            g = self.generation(row)
        except ValueError as e:
            return {**out, **dict.fromkeys(cols), "terminator_logprobs": None,
                    "error": f"cannot read the generation: {e}"}  # fmt: skip
        # The library's measures on the empty-answer rule's log-probs: an empty answer scores its
        # stop token's NLL under both G-NLL and LN-G-NLL (one token), as on every other surface.
        lps = g.measured_logprobs
        return {
            **out,
            "answer": g.text, "g_nll": M.g_nll(lps), "ln_g_nll": M.ln_g_nll(lps),
            "num_tokens": g.num_tokens, "finish_reason": g.finish_reason,
            "stop_sequence": g.stop_sequence, "terminator_logprobs": list(g.terminator_logprobs),
            "error": None,
        }  # fmt: skip

    def generation(self, row: dict[str, Any]) -> Any:
        """The :class:`~gnll.backends.base.Generation` of one vLLM output row."""
        from gnll.backends.openai.client import ServerError
        from gnll.backends.openai.parse import read_choice, to_generation

        ids = [int(t) for t in row.get("generated_tokens") or []]
        positions = row.get("logprobs") or []
        if len(positions) != len(ids):
            raise ValueError(f"{len(ids)} generated tokens but {len(positions)} logprobs entries")
        tokens, values = [], []
        for i, p in zip(ids, positions, strict=True):
            e = _entry(p, i)
            if e is None:
                raise ValueError(f"no log-prob for generated token {i}")
            tokens.append(e.get("decoded_token") or self.side.decode([i]))
            values.append(float(e["logprob"]))
        text = str(row.get("generated_text") or "")
        tail = "".join(tokens)[len(text) :] if "".join(tokens).startswith(text) else ""
        stopped = any(tail.startswith(s) for s in self.config.stop)
        ended = bool(ids) and ids[-1] in self.eos_ids
        finish = "stop" if stopped or ended else "length"
        choice = {
            "text": text, "token_ids": ids, "finish_reason": finish,
            "logprobs": {"tokens": tokens, "token_logprobs": values},
        }  # fmt: skip
        try:
            return to_generation(read_choice(choice), self.config, eos_logprob=True, where="row")
        except ServerError as e:
            raise ValueError(str(e)) from None
