"""The measure registry: every measure's name, label, function and inputs, in one place.

Callers (``gnll ask``, the evaluation runner, reports and plots, scoring, serving) use :data:`ORDER`,
:func:`compute` and :func:`requirements` rather than interpreting :attr:`Measure.needs` themselves, and
ask :func:`unsupported` which measures a backend cannot compute before doing any work.

Example
-------
>>> from gnll import measures
>>> measures.requirements(["g-nll", "se"]) == measures.Needs.GREEDY | measures.Needs.SAMPLES | (
...     measures.Needs.CLUSTERS)
True
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from gnll.measures.functions import (
    G_NLL_EOS,
    TokenLogprobs,
    discrete_semantic_entropy,
    g_nll,
    g_nll_eos,
    ln_g_nll,
    ln_predictive_entropy,
    ln_semantic_entropy,
    ln_semantic_entropy_plugin,
    max_cluster_probability,
    msp_estimate,
    predictive_entropy,
    semantic_entropy,
    semantic_entropy_plugin,
)

__all__ = [
    "Evidence",
    "MEASURES",
    "Measure",
    "Needs",
    "ORDER",
    "PAPER_BASELINES",
    "VARIANTS",
    "WITH_VARIANTS",
    "computable",
    "compute",
    "get",
    "required_capabilities",
    "requirements",
    "terminator_logprobs",
    "unsupported",
    "validate",
]


class Needs(enum.Flag):
    """The evidence a measure is computed from (combine with ``|``).

    ``CLUSTERS`` are the semantic cluster ids of the sampled answers, so producing them also needs
    ``SAMPLES`` (see :func:`requirements`); the ``TERMINATOR`` comes with the ``GREEDY`` answer.
    """

    GREEDY = enum.auto()  # token log-probs of the greedy answer
    BEAMS = enum.auto()  # token log-probs of K beam-search outputs
    SAMPLES = enum.auto()  # token log-probs of N sampled answers
    CLUSTERS = enum.auto()  # semantic cluster ids of the N sampled answers
    TERMINATOR = enum.auto()  # log-probs of the token(s) that ended the greedy answer


Source = Literal["greedy", "beams", "samples"]


@dataclass(frozen=True)
class Measure:
    """One uncertainty measure: what it is called, what it computes and from what.

    Attributes
    ----------
    name:
        Short name used on the command line and as the key in records (``"g-nll"``).
    label:
        Name in tables and figures (``"G-NLL"``).
    fn:
        The pure function. Its arguments follow from ``needs``: one output's token log-probs
        (``GREEDY``), a list of them (``BEAMS``, ``SAMPLES``), the list and the cluster ids
        (``SAMPLES | CLUSTERS``), or the cluster ids alone (``CLUSTERS``).
    needs:
        The evidence ``fn`` consumes.
    capabilities:
        Backend capabilities (attribute names of :class:`gnll.backends.base.Capabilities`) the
        evidence requires beyond plain generation, e.g. ``("beams",)`` for BS-MSP.
    """

    name: str
    label: str
    fn: Callable[..., float]
    needs: Needs
    capabilities: tuple[str, ...] = ()

    @property
    def source(self) -> Source:
        """Which generations the measure is computed from (and whose tokens it costs)."""
        if Needs.GREEDY in self.needs:
            return "greedy"
        if Needs.BEAMS in self.needs:
            return "beams"
        return "samples"

    @property
    def uses_samples(self) -> bool:
        """True for the sampling-based measures (they need N sampled answers)."""
        return self.source == "samples"

    @property
    def uses_clusters(self) -> bool:
        """True for the semantic measures (they need the samples' cluster ids)."""
        return Needs.CLUSTERS in self.needs

    def compute(self, evidence: Evidence) -> float:
        """Apply :attr:`fn` to the parts of ``evidence`` that :attr:`needs` names."""
        lacking = self.needs & ~evidence.available
        if lacking:
            raise ValueError(
                f"measure {self.name!r} needs {_describe(lacking)}, which were not given"
            )
        if self.needs == Needs.GREEDY:
            return self.fn(evidence.greedy)
        if self.needs == Needs.GREEDY | Needs.TERMINATOR:
            return self.fn(evidence.greedy, evidence.terminator)
        if self.needs == Needs.BEAMS:
            return self.fn(evidence.beams)
        if self.needs == Needs.SAMPLES:
            return self.fn(evidence.samples)
        if self.needs == Needs.SAMPLES | Needs.CLUSTERS:
            return self.fn(evidence.samples, evidence.cluster_ids)
        if self.needs == Needs.CLUSTERS:
            return self.fn(evidence.cluster_ids)
        raise AssertionError(f"no calling convention for needs={self.needs!r}")  # pragma: no cover


def _describe(needs: Needs) -> str:
    return " and ".join(f.name.lower() for f in Needs if f in needs)  # type: ignore[union-attr]


class HasTokenLogprobs(Protocol):
    """Anything carrying one output's token log-probs (e.g. :class:`gnll.backends.Generation`)."""

    token_logprobs: Sequence[float]


Output = TokenLogprobs | HasTokenLogprobs


def _logprobs_of(output: Output) -> TokenLogprobs:
    # A Generation's measured_logprobs carries the empty-answer rule (its stop token's log-prob).
    lp = getattr(output, "measured_logprobs", None)
    if lp is None:
        lp = getattr(output, "token_logprobs", None)
    return output if lp is None else lp  # type: ignore[return-value]


def terminator_logprobs(output: Any, measured: TokenLogprobs | None = None) -> list[float] | None:
    """The log-probs of the token(s) that ended ``output`` which ``measured`` does not already count.

    ``measured`` defaults to the output's :attr:`~gnll.backends.Generation.measured_logprobs`,
    which for an **empty answer** already is its first terminator token (the empty-answer rule):
    the rest of the terminator follows, so the answer plus this is the whole sequence, each token
    once. An answer cut by ``max_new_tokens`` (``finish_reason == "length"``) has no terminator:
    ``[]`` (as in LM-Polygraph, nothing to add). ``None`` when the terminator ended the answer
    but its log-probs are unknown (a server that does not report them, or ``gnll serve``'s early
    decision): then no measure that needs it can be computed.

    >>> from gnll.backends import Generation
    >>> terminator_logprobs(Generation("a", [1], ["a"], [-0.5], "eos", terminator_token_ids=[2],
    ...                                terminator_logprobs=[-0.25]))
    [-0.25]
    >>> terminator_logprobs(Generation("", [], [], [], "stop", terminator_token_ids=[198, 5],
    ...                                terminator_logprobs=[-2.0, -0.5]))
    [-0.5]
    >>> terminator_logprobs(Generation("a b", [1, 2], ["a", " b"], [-0.5, -1.0], "length"))
    []
    """
    if getattr(output, "finish_reason", None) == "length":
        return []
    terminator = getattr(output, "terminator_logprobs", None)
    if not terminator:
        return None
    if measured is None:
        measured = _logprobs_of(output)
    answer = getattr(output, "token_logprobs", None) or []
    counted = max(len(measured) - len(answer), 0)  # the empty-answer rule's stop token
    return [float(x) for x in terminator[counted:]]


@dataclass(frozen=True)
class Evidence:
    """The generations of one question that measures are computed from (``None``: not available)."""

    greedy: TokenLogprobs | None = None
    beams: list[TokenLogprobs] | None = None
    samples: list[TokenLogprobs] | None = None
    cluster_ids: list[int] | None = None
    #: The greedy answer's terminator log-probs not already in ``greedy``
    #: (:func:`terminator_logprobs`).
    terminator: TokenLogprobs | None = None

    @classmethod
    def of(
        cls,
        greedy: Output | None = None,
        beams: Sequence[Output] | None = None,
        samples: Sequence[Output] | None = None,
        cluster_ids: Sequence[int] | np.ndarray | None = None,
        terminator: TokenLogprobs | None = None,
    ) -> Evidence:
        """Evidence from generations or raw token log-prob sequences.

        A greedy ``Generation`` brings its own terminator (:func:`terminator_logprobs`); with raw
        log-probs, give ``terminator`` (those of the terminator not in ``greedy``) to compute
        ``g-nll+eos``.
        """
        greedy_lps = None if greedy is None else _logprobs_of(greedy)
        if terminator is None and greedy is not None and greedy_lps is not greedy:
            terminator = terminator_logprobs(greedy, greedy_lps)
        return cls(
            greedy=greedy_lps,
            beams=None if beams is None else [_logprobs_of(b) for b in beams],
            samples=None if samples is None else [_logprobs_of(s) for s in samples],
            cluster_ids=None if cluster_ids is None else [int(c) for c in cluster_ids],
            terminator=None if terminator is None else [float(x) for x in terminator],
        )

    @property
    def available(self) -> Needs:
        have = Needs(0)
        for flag, part in (
            (Needs.GREEDY, self.greedy),
            (Needs.BEAMS, self.beams),
            (Needs.SAMPLES, self.samples),
            (Needs.CLUSTERS, self.cluster_ids),
            (Needs.TERMINATOR, self.terminator),
        ):
            if part is not None:
                have |= flag
        return have


_REGISTRY = (
    Measure("pe", "PE", predictive_entropy, Needs.SAMPLES),
    Measure("ln-pe", "LN-PE", ln_predictive_entropy, Needs.SAMPLES),
    Measure("se", "SE", semantic_entropy, Needs.SAMPLES | Needs.CLUSTERS),
    Measure("ln-se", "LN-SE", ln_semantic_entropy, Needs.SAMPLES | Needs.CLUSTERS),
    Measure("d-se", "D-SE", discrete_semantic_entropy, Needs.CLUSTERS),
    # The plug-in (Rao-Blackwellised) forms of Farquhar et al.'s code; "se"/"ln-se" are Eq. (5).
    Measure("se-rb", "SE-RB", semantic_entropy_plugin, Needs.SAMPLES | Needs.CLUSTERS),
    Measure("ln-se-rb", "LN-SE-RB", ln_semantic_entropy_plugin, Needs.SAMPLES | Needs.CLUSTERS),
    Measure("mcp", "MCP", max_cluster_probability, Needs.SAMPLES | Needs.CLUSTERS),
    Measure("g-nll", "G-NLL", g_nll, Needs.GREEDY),
    Measure("ln-g-nll", "LN-G-NLL", ln_g_nll, Needs.GREEDY),
    Measure("bs-msp", "BS-MSP", msp_estimate, Needs.BEAMS, capabilities=("beams",)),
)

#: The measures ``"all"`` selects and every table has a column for, by name, in :data:`ORDER`.
MEASURES: dict[str, Measure] = {m.name: m for m in _REGISTRY}

#: Named variants of a measure, computed only when asked for by name (never by default or by
#: ``"all"``; a table shows a variant's column only when a run has it). ``g-nll+eos`` is
#: LM-Polygraph's ``MaximumSequenceProbability`` definition: G-NLL plus the NLL of the token(s)
#: that ended the answer (:func:`~gnll.measures.functions.g_nll_eos`, without its
#: ``masked_logprobs`` renormalisation).
VARIANTS: dict[str, Measure] = {
    m.name: m
    for m in (Measure(G_NLL_EOS, "G-NLL+EOS", g_nll_eos, Needs.GREEDY | Needs.TERMINATOR),)
}

#: Column order of tables and figures: the paper's Table 1 baselines (PE ... D-SE), then the plug-in
#: SE forms (SE-RB, LN-SE-RB) and MCP, which the paper does not report, then G-NLL (Table 1's last
#: column), LN-G-NLL (Table 4) and BS-MSP.
ORDER: tuple[str, ...] = tuple(MEASURES)

#: Every name :func:`get` knows: :data:`ORDER`, then the :data:`VARIANTS`.
WITH_VARIANTS: tuple[str, ...] = ORDER + tuple(VARIANTS)

#: The paper's sampling-based baselines (G-NLL's significance is tested against the best of them).
PAPER_BASELINES: tuple[str, ...] = ("pe", "ln-pe", "se", "ln-se", "d-se")


def get(name: str) -> Measure:
    """The measure called ``name``; a ``ValueError`` listing the choices otherwise.

    Examples
    --------
    >>> get("g-nll").label
    'G-NLL'
    """
    try:
        return MEASURES[name] if name in MEASURES else VARIANTS[name]
    except KeyError:
        raise ValueError(
            f"unknown measure {name!r}; choose from {', '.join(WITH_VARIANTS)}"
        ) from None


def validate(names: str | Sequence[str], *, paper_order: bool = False) -> list[str]:
    """Check measure names (a list, or a comma-separated string; ``"all"`` selects every measure).

    Duplicates are dropped. The given order is kept unless ``paper_order`` is true (then
    :data:`WITH_VARIANTS`). A variant (:data:`VARIANTS`) is selected only by its name.

    Examples
    --------
    >>> validate("g-nll, pe,g-nll")
    ['g-nll', 'pe']
    >>> validate(["g-nll", "pe"], paper_order=True)
    ['pe', 'g-nll']
    """
    if isinstance(names, str):
        names = list(ORDER) if names.strip() == "all" else names.split(",")
    wanted = list(dict.fromkeys(n.strip() for n in names if n.strip()))
    unknown = [n for n in wanted if n not in WITH_VARIANTS]
    if unknown:
        raise ValueError(f"unknown measure(s) {unknown}; choose from {', '.join(WITH_VARIANTS)}")
    if not wanted:
        raise ValueError(f"no measures selected; choose from {', '.join(ORDER)}")
    return [n for n in WITH_VARIANTS if n in wanted] if paper_order else wanted


def requirements(names: Sequence[str]) -> Needs:
    """Everything that must be generated for ``names`` (cluster ids imply the samples they cluster).

    Examples
    --------
    >>> requirements(["d-se"]) == Needs.SAMPLES | Needs.CLUSTERS
    True
    """
    need = Needs(0)
    for n in names:
        need |= get(n).needs
    if Needs.CLUSTERS in need:
        need |= Needs.SAMPLES
    if Needs.TERMINATOR in need:
        need |= Needs.GREEDY
    return need


def required_capabilities(names: Sequence[str]) -> list[str]:
    """Backend capabilities needed by ``names`` (attribute names of ``Capabilities``).

    Examples
    --------
    >>> required_capabilities(["g-nll", "bs-msp"])
    ['beams']
    """
    return list(dict.fromkeys(c for n in names for c in get(n).capabilities))


def unsupported(names: Sequence[str], capabilities: Any) -> dict[str, list[str]]:
    """The measures among ``names`` a backend cannot compute, with the capabilities each lacks.

    ``capabilities`` is a backend's :class:`~gnll.backends.base.Capabilities` (anything with a
    ``missing(list_of_names) -> list_of_names`` method). Check it before doing any work::

        bad = measures.unsupported(wanted, model.capabilities)
        if bad:
            ok = [m for m in wanted if m not in bad]
            raise ValueError(f"{model.name} cannot compute {sorted(bad)}; it can run {ok}")
    """
    out: dict[str, list[str]] = {}
    for n in names:
        lacking = capabilities.missing(list(get(n).capabilities))
        if lacking:
            out[n] = list(lacking)
    return out


def compute(
    names: Sequence[str],
    greedy: Output | None = None,
    beams: Sequence[Output] | None = None,
    samples: Sequence[Output] | None = None,
    cluster_ids: Sequence[int] | np.ndarray | None = None,
    terminator: TokenLogprobs | None = None,
) -> dict[str, float]:
    """Compute the measures ``names`` of one question (keys in ``names`` order).

    Each of ``greedy`` (one output), ``beams`` and ``samples`` (lists of outputs) is a sequence of
    token log-probs or a ``Generation`` (its ``measured_logprobs``: an empty answer counts its stop
    token's log-prob) or another object with a ``token_logprobs`` attribute;
    ``cluster_ids`` gives the samples' semantic clusters; ``terminator`` the greedy answer's
    terminator log-probs when ``greedy`` is raw log-probs (:func:`terminator_logprobs`; a
    ``Generation`` brings its own). A measure whose evidence is missing raises
    ``ValueError``; use :func:`computable` to select the measures the evidence allows.

    Examples
    --------
    >>> compute(["g-nll", "pe"], greedy=[-0.5, -0.25], samples=[[-1.0, -1.0], [-0.5]])
    {'g-nll': 0.75, 'pe': 1.25}
    >>> compute(["g-nll", "g-nll+eos"], greedy=[-0.5, -0.25], terminator=[-0.125])
    {'g-nll': 0.75, 'g-nll+eos': 0.875}
    """
    evidence = Evidence.of(greedy, beams, samples, cluster_ids, terminator)
    return {n: get(n).compute(evidence) for n in names}


def computable(names: Sequence[str], available: Needs) -> list[str]:
    """The measures among ``names`` whose evidence is all in ``available``.

    Examples
    --------
    >>> computable(["g-nll", "bs-msp", "pe"], Needs.GREEDY | Needs.SAMPLES)
    ['g-nll', 'pe']
    """
    return [n for n in names if get(n).needs & ~available == Needs(0)]
