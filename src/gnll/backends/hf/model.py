"""``HFModel``: the transformers backend's facade over its parts (see :mod:`gnll.backends.hf`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gnll._util import progress as show_progress_bar
from gnll._util import progress_enabled
from gnll.backends.base import (
    DEFAULT_STOP,
    Capabilities,
    ContextOverflow,
    Generation,
    GenerationConfig,
    Model,
    ScoredAnswer,
    chat_messages,
)
from gnll.backends.constrained import ConstrainedGeneration
from gnll.backends.hf.beam import beam_search
from gnll.backends.hf.decode import Decoder, decode, refillable
from gnll.backends.hf.hf_generate import generate_batch, neutralise_generation_config
from gnll.backends.hf.kv_cache import plain_cache
from gnll.backends.hf.loading import load_pretrained, use_chat_template
from gnll.backends.hf.planning import halving_on_oom, pack_batches
from gnll.backends.hf.prefill import Prefiller, pad_token_id
from gnll.backends.hf.scoring import answer_end_ids, score_answers, score_ids
from gnll.backends.hf.stopping import StopRules
from gnll.backends.model_args import BeamDecoderName, DecoderName

log = logging.getLogger(__name__)


class HFModel(Model):
    """A causal LM from transformers behind the :class:`~gnll.backends.base.Model` interface.

    Parameters
    ----------
    model, tokenizer:
        A loaded causal LM and its tokenizer.
    name:
        Name recorded in results.
    chat_template:
        Wrap prompts as a user turn of the tokenizer's chat template. ``None`` decides from the name
        (instruction-tuned checkpoints) and whether the tokenizer has a template.
    batch_size:
        Default number of sequences (rows) per forward pass; sampling N per prompt uses N rows a prompt.
        Decoding steps of a small model on CPU cost about as much for 64 rows as for 10 (per-step
        overhead dominates), so wide batches are what make sampling and beams affordable.
    max_batch_tokens:
        Bound on ``rows x (longest prompt + max_new_tokens)`` of a batch: the KV cache positions it
        holds. Batches of long prompts get fewer rows, so peak memory depends on this budget, not on
        the longest prompt a run happens to meet. The default fits 64 rows of a 5-shot short-answer
        prompt (about 270 tokens) and its answer in one batch: a leftover batch of a few rows would
        pay the whole per-step cost of decoding again. ``None`` bounds by rows only.
    source:
        Where the weights came from, recorded by :meth:`info`.
    decoder:
        ``"loop"``: gnll's own decoding loop and prefill (shared prefix, dropped rows); ``"generate"``:
        transformers' ``model.generate`` on plainly padded prompts for everything (the reference the
        loop is tested against, and what models with other caches need); ``"auto"``: the loop when
        the model's cache allows it.
    beam_decoder:
        With the loop: ``"loop"`` runs beam search in gnll's loop (:mod:`.beam`: the beams of
        transformers' beam search, the prompt prefilled once, done prompts dropped);
        ``"generate"`` uses ``model.generate`` fed with the loop's prefill cache (the reference
        the loop's beams are tested against).
    continuous_batching:
        With the loop, for greedy decoding and sampling of a model with full attention: all prompts
        of a call share one batch of ``batch_size`` rows, and a prompt waiting for room takes the
        slots of rows that finished (continuous batching). ``False``: fixed batches, each decoded
        until its last row finishes (finished rows leave, nothing joins).

    Attributes
    ----------
    decoder:
        The decoder in use, ``"loop"`` or ``"generate"``.
    engine:
        The :class:`~.prefill.Prefiller` of the loop (shared prefix, prefill, forward passes);
        ``None`` with ``decoder="generate"``.
    capabilities:
        What this backend computes (all of it; ``chat`` when prompts get the chat template).

    Examples
    --------
    >>> from gnll import load_model
    >>> model = load_model("smollm2-135m-instruct", progress=False)
    >>> [[gen]] = model.generate(["What is the capital of France?"])
    >>> len(gen.token_logprobs) == len(gen.token_ids) > 0, max(gen.token_logprobs) <= 0
    (True, True)
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        name: str,
        chat_template: bool | None = None,
        batch_size: int = 64,
        max_batch_tokens: int | None = 20480,
        source: str | None = None,
        decoder: DecoderName = "auto",
        beam_decoder: BeamDecoderName = "loop",
        continuous_batching: bool = True,
    ) -> None:
        if int(batch_size) < 1 or (max_batch_tokens is not None and int(max_batch_tokens) < 1):
            raise ValueError(
                f"batch_size ({batch_size}) and max_batch_tokens ({max_batch_tokens}) must be >= 1"
            )
        if decoder not in ("auto", "loop", "generate"):
            raise ValueError(f"decoder must be 'auto', 'loop' or 'generate', got {decoder!r}")
        if beam_decoder not in ("loop", "generate"):
            raise ValueError(f"beam_decoder must be 'loop' or 'generate', got {beam_decoder!r}")
        loop_ok = plain_cache(model)
        if decoder == "loop" and not loop_ok:
            raise ValueError(
                f"decoder='loop' needs a plain attention KV cache, which {name!r} does not have; "
                "use decoder='auto' or 'generate'"
            )
        self.model = model.eval()
        # A checkpoint's generation_config.json (do_sample, top_k, repetition_penalty, ...) must not
        # leak into generate(): what it asked for is recorded in info() and ignored.
        self.ignored_generation_config = neutralise_generation_config(model)
        self.tokenizer = tokenizer
        self.name = name
        self.batch_size = int(batch_size)
        self.max_batch_tokens = None if max_batch_tokens is None else int(max_batch_tokens)
        self.source = source or name
        # The caller's tokenizer is not touched (no pad token or padding side set on it): gnll
        # lays out padding itself, left, with this id.
        self.pad_token_id = pad_token_id(tokenizer)
        self.chat_template = use_chat_template(chat_template, name, tokenizer)
        self.decoder: str = "loop" if decoder == "auto" and loop_ok else decoder
        if self.decoder == "auto":
            # Said aloud: this is several times slower, and a transformers release that renamed a
            # forward argument once sent every model here without anyone noticing.
            log.warning(
                "%s: gnll's decoding loop cannot drive %s (no plain attention KV cache); "
                "decoding with transformers' generate, which is slower",
                name,
                type(model).__name__,
            )
            self.decoder = "generate"
        self.engine = Prefiller(model, self.pad_token_id) if self.decoder == "loop" else None
        #: Beam search in gnll's loop (:mod:`.beam`); ``beam_decoder="generate"`` keeps
        #: transformers' (the same beams, slower: the benchmarks compare the two).
        self.own_beam_search = beam_decoder == "loop"
        #: Greedy decoding and sampling as one loop over all prompts of a call, where a waiting
        #: prompt takes the slot of a finished row (full-attention models; see :mod:`.decode`).
        self.continuous_batching = bool(continuous_batching)
        self.capabilities = Capabilities(
            beams=True,
            scoring=True,
            terminator=True,
            chat=self.chat_template,
            sampling_logprobs=True,
            # open_decoder() runs one (gnll's loop, continuous batching, full attention)
            streaming=(
                self.engine is not None and self.continuous_batching and refillable(self.engine)
            ),
        )
        self._stop_rules_cache: dict[tuple[str, ...], StopRules] = {}

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        *,
        name: str | None = None,
        device: str = "auto",
        dtype: str = "auto",
        revision: str | None = None,
        trust_remote_code: bool = False,
        gguf_file: str | None = None,
        fast_tokenizer: bool = False,
        **kwargs: Any,
    ) -> HFModel:
        """Load any Hugging Face hub id or local directory (optionally a GGUF file inside it).

        ``fast_tokenizer=True`` builds the tokenizer straight from a local ``tokenizer.json`` (see
        :func:`~.loading.load_tokenizer_json`); gnll uses it for its own cached checkpoints. Other
        keyword arguments go to :class:`HFModel`.
        """
        model, tokenizer = load_pretrained(
            name_or_path,
            device=device,
            dtype=dtype,
            revision=revision,
            trust_remote_code=trust_remote_code,
            gguf_file=gguf_file,
            fast_tokenizer=fast_tokenizer,
        )
        return cls(model, tokenizer, name=name or name_or_path, source=name_or_path, **kwargs)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "architecture": type(self.model).__name__,
            "dtype": str(next(self.model.parameters()).dtype),
            "device": str(self.device),
            "chat_template": self.chat_template,
            "decoder": self.decoder,
            "vocab_size": len(self.tokenizer),
            "ignored_generation_config": self.ignored_generation_config,
        }

    # ------------------------------------------------------------------ prompts and stops
    def render_prompt(self, prompt: str) -> str:
        if not isinstance(prompt, str):
            raise TypeError(f"prompts must be strings, got {type(prompt).__name__}")
        if not self.chat_template:
            return prompt
        # A ChatPrompt brings its own turns (few-shot exchanges); any other text is one user turn.
        return self.tokenizer.apply_chat_template(
            chat_messages(prompt), add_generation_prompt=True, tokenize=False
        )

    def encode(self, prompts: Sequence[str], *, raw_prompt: bool = False) -> list[list[int]]:
        """The token ids the model conditions on for each prompt (after :meth:`render_prompt`;
        ``raw_prompt=True``: the text as it is, with the tokenizer's special tokens)."""
        if isinstance(prompts, str):
            raise TypeError("prompts must be a list of strings; wrap a single prompt as [prompt]")
        templated = self.chat_template and not raw_prompt
        texts = [self.render_prompt(p) for p in prompts] if templated else list(prompts)
        # A chat template already contains the special tokens (BOS etc.); plain prompts get them here.
        enc = self.tokenizer(texts, add_special_tokens=not templated)
        return [list(ids) for ids in enc["input_ids"]]

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of ``token_ids`` (the tokenizer's ``decode``)."""
        return self.tokenizer.decode(token_ids)

    @property
    def eos_ids(self) -> set[int]:
        """The token ids that end a generation (the tokenizer's EOS and the generation config's)."""
        return set(self._eos_ids)

    @cached_property
    def _eos_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id}
        gen_eos = getattr(self.model.generation_config, "eos_token_id", None)
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif gen_eos:
            ids.update(gen_eos)
        return {i for i in ids if i is not None}

    def stop_rules(self, stop: tuple[str, ...]) -> StopRules:
        """The stopping rules (stop token ids, multi-token stop strings, answer split) for ``stop``."""
        if stop not in self._stop_rules_cache:
            self._stop_rules_cache[stop] = StopRules(
                self.tokenizer, stop, self._eos_ids, device=self.device
            )
        return self._stop_rules_cache[stop]

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        prompts: Sequence[str],
        config: GenerationConfig | None = None,
        *,
        batch_size: int | None = None,
        progress: bool | Callable[[float], None] = False,
        raw_prompt: bool = False,
    ) -> list[list[Generation]]:
        config = config or GenerationConfig.greedy()
        encoded = self.encode(prompts, raw_prompt=raw_prompt)
        if not encoded:
            return []
        self.check_context(encoded, config.max_new_tokens)
        stops = self.stop_rules(config.stop)
        rows_per_batch = batch_size or self.batch_size
        # Longest first: similar lengths share a batch (little padding) and memory peaks show early.
        order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
        batches = pack_batches(
            [len(encoded[i]) for i in order],
            max_prompts=max(1, rows_per_batch // config.num_sequences),
            rows_per_prompt=config.num_sequences,
            extra=config.max_new_tokens,
            max_tokens=self.max_batch_tokens,
        )
        engine = self.engine
        # The few-shot block that every prompt of an evaluation chunk repeats is computed once here.
        prefix = engine.shared_prefix(encoded) if engine is not None else None
        results: list[list[Generation]] = [[] for _ in encoded]
        desc = f"{self.name} {config.strategy}"
        # A callable ``progress`` hears about every finished prompt (fractions: a prompt's finished
        # samples) instead of a bar per batch, so a caller's bar moves within a batch.
        on_done = progress if callable(progress) else None

        continuous = (
            engine is not None
            and self.continuous_batching
            and config.strategy != "beam"
            and refillable(engine)  # full attention: any shared prefix fits
        )
        if continuous:
            # One decoding loop for every prompt: a finished row's slot goes to a waiting prompt.
            width = max(1, rows_per_batch // config.num_sequences)
            if self.max_batch_tokens is not None:
                per_prompt = config.num_sequences * (len(encoded[order[0]]) + config.max_new_tokens)
                width = max(1, min(width, self.max_batch_tokens // per_prompt))
            batches = [order]
        else:
            batches = [[order[j] for j in b] for b in batches]
        bar = None
        if continuous and on_done is None and progress_enabled(bool(progress)):
            from tqdm.auto import tqdm

            bar = tqdm(total=len(encoded), desc=desc, unit="prompt")
            on_done = bar.update

        def run(batch: list[int]) -> list[list[Generation]]:
            rows = [encoded[i] for i in batch]
            use = None
            if engine is not None and engine.prefix_fits(prefix, rows, config.max_new_tokens):
                use = prefix
            if engine is None or (config.strategy == "beam" and not self.own_beam_search):
                outs = generate_batch(
                    self.model,
                    self.tokenizer,
                    rows,
                    config,
                    stops,
                    engine=engine,
                    prefix=use,
                    scorer=self._score_ids,
                )
                if on_done is not None:
                    on_done(len(batch))
                return outs
            if config.strategy == "beam":
                return beam_search(engine, rows, config, use, stops, on_done=on_done)
            if continuous:
                n = config.num_sequences
                return decode(engine, rows, config, use, stops, width=width * n, on_done=on_done)
            return decode(engine, rows, config, use, stops, refill=False, on_done=on_done)

        loop_bar = bool(progress) and not on_done
        try:
            for batch in show_progress_bar(batches, loop_bar, desc, unit="batch"):
                # An out-of-memory batch is retried in halves before the error reaches the user.
                for i, gens in zip(batch, halving_on_oom(run, batch), strict=True):
                    results[i] = gens
        finally:
            if bar is not None:
                bar.close()
        return results

    def open_decoder(self, config: GenerationConfig, *, width: int | None = None) -> Decoder | None:
        """A decoding loop that prompts can join while it runs (continuous batching for servers).

        Prompts go in encoded (:meth:`encode`; check them with :meth:`check_context`) with
        :meth:`~.decode.Decoder.add`, and each :meth:`~.decode.Decoder.step` returns the prompts
        that finished. ``None`` when this model cannot run one: beam search, ``decoder="generate"``,
        ``continuous_batching=False`` or a sliding-window cache.

        Examples
        --------
        >>> from gnll import load_model
        >>> model = load_model("smollm2-135m-instruct", progress=False)
        >>> dec = model.open_decoder(GenerationConfig.greedy(), width=8)
        >>> dec.add("q1", model.encode(["What is the capital of France?"])[0])
        >>> done = []
        >>> while dec.busy:
        ...     done += dec.step()
        >>> [(tag, len(gens)) for tag, gens in done]
        [('q1', 1)]
        """
        engine = self.engine
        if (
            engine is None
            or not self.continuous_batching
            or config.strategy == "beam"
            or not refillable(engine)
        ):
            return None
        rows = width or self.batch_size
        return Decoder(engine, config, self.stop_rules(config.stop), width=rows)

    def check_context(self, encoded: Sequence[Sequence[int]], max_new_tokens: int) -> None:
        """A clear error for a prompt the model's context cannot hold (before any computing)."""
        context = getattr(self.model.config, "max_position_embeddings", None)
        if not context:
            return
        for i, ids in enumerate(encoded):
            if len(ids) + max_new_tokens > context:
                raise ContextOverflow(self.name, i, len(ids), max_new_tokens, context)

    # ------------------------------------------------------------------ scoring
    def score(
        self,
        prompts: Sequence[str],
        answers: Sequence[str],
        *,
        raw_prompt: bool = False,
        batch_size: int | None = None,
        progress: bool = False,
    ) -> list[ScoredAnswer]:
        """Teacher-forced scores of given answers: log-probs, whether greedy, whether greedy stops.

        Each prompt is rendered as :meth:`generate` renders it (``raw_prompt=True``: used as the
        exact text), prompt + answer are tokenised once jointly, and the answer's tokens are scored
        after the prompt's own tokens (see :func:`~.scoring.tokenize_answers` for a boundary the
        tokenizer merged; such rows have ``boundary_merged=True``). Answers are scored verbatim,
        so after a few-shot ``"Answer:"`` prompt pass ``" Paris"`` as the model would write it.
        Rows are batched like generation (``batch_size`` rows, ``max_batch_tokens`` positions),
        the prompts' shared prefix runs once.

        ``is_greedy``: every answer token is the model's top-1 token at its position.
        ``greedy_stops``: the top-1 token after the answer ends it (EOS, a token containing one of
        :data:`~gnll.backends.base.DEFAULT_STOP`, or the first token of one).

        Examples
        --------
        >>> from gnll import load_model
        >>> model = load_model("smollm2-135m-instruct", progress=False)
        >>> [[g]] = model.generate(["What is the capital of France?"])
        >>> [s] = model.score(["What is the capital of France?"], [g.text])
        >>> g.finish_reason, abs(s.nll + g.logprob) < 1e-4, s.is_greedy, s.greedy_stops
        ('eos', True, True, True)
        """
        if isinstance(prompts, str) or isinstance(answers, str):
            raise TypeError("prompts and answers must be lists of strings; wrap one item as [item]")
        if len(prompts) != len(answers):
            raise ValueError(
                f"got {len(prompts)} prompts but {len(answers)} answers; pass one each"
            )
        for i, (p, a) in enumerate(zip(prompts, answers, strict=True)):
            if not isinstance(p, str) or not isinstance(a, str):
                raise TypeError(f"prompt and answer {i} must be strings")
        texts = [p if raw_prompt else self.render_prompt(p) for p in prompts]
        return score_answers(
            self.model,
            self.tokenizer,
            texts,
            list(answers),
            add_special_tokens=not self.chat_template,
            end_ids=self._answer_end_ids,
            engine=self.engine,
            batch_size=batch_size or self.batch_size,
            max_batch_tokens=self.max_batch_tokens,
            progress=progress,
        )

    @cached_property
    def _answer_end_ids(self) -> frozenset[int]:
        return answer_end_ids(self.tokenizer, self.stop_rules(DEFAULT_STOP))

    def generate_constrained(
        self,
        prompt: str,
        grammar: str,
        *,
        max_new_tokens: int,
        raw_prompt: bool = False,
        watch: Callable[[str, float], bool] | None = None,
    ) -> ConstrainedGeneration:
        """Greedy decoding under a grammar (:mod:`gnll.backends.hf.constrained`; needs
        llguidance): the raw and the constrained log-probs of each token; ``watch`` stops it at
        an early decision."""
        from gnll.backends.hf.constrained import generate_constrained

        [ids] = self.encode([prompt], raw_prompt=raw_prompt)
        self.check_context([ids], max_new_tokens)
        return generate_constrained(
            self.model,
            self.tokenizer,
            ids,
            grammar,
            max_new_tokens=max_new_tokens,
            eos_ids=self.eos_ids,
            watch=watch,
        )

    def score_tokens(
        self, prompts: Sequence[str], token_ids: Sequence[Sequence[int]]
    ) -> list[np.ndarray]:
        """Teacher-forced ``log p(c_t | prompt, c_<t)`` of given token ids after each prompt, float64.

        Prompts are rendered as :meth:`generate` renders them; ``token_ids[i]`` continue prompt i.

        Examples
        --------
        >>> from gnll import load_model
        >>> model = load_model("smollm2-135m-instruct", progress=False)
        >>> [[g]] = model.generate(["Capital of France?"])
        >>> lp = model.score_tokens(["Capital of France?"], [g.token_ids])[0]
        >>> bool(np.allclose(lp, g.token_logprobs, atol=1e-4))
        True
        """
        if len(prompts) != len(token_ids):
            raise ValueError(
                f"got {len(prompts)} prompts but {len(token_ids)} token id lists; pass one each"
            )
        return self._score_ids(self.encode(prompts), [list(c) for c in token_ids])

    def _score_ids(self, prompt_ids: list[list[int]], conts: list[list[int]]) -> list[np.ndarray]:
        self.check_context([[*p, *c] for p, c in zip(prompt_ids, conts, strict=True)], 0)
        scored = score_ids(
            self.model,
            self.tokenizer,
            prompt_ids,
            conts,
            engine=self.engine,
            batch_size=self.batch_size,
            max_batch_tokens=self.max_batch_tokens,
        )
        return [s.logprobs for s in scored]
