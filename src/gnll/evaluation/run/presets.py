"""Paper presets: the model grids, judge and settings of the paper's tables, by name.

``gnll eval --preset paper-table1 --output runs/paper`` runs the paper's Table 1 grid (six
models x six tasks, F1 and LLM-as-a-judge correctness) on a GPU machine, one run directory per model
under ``--output``, then writes the merged ``table.md`` there. Any option given on the command
line overrides the preset's value: ``--model`` (comma-separated) replaces the model list, ``--judge``
the judge, ``--limit`` caps every task, ``--model_args backend=openai,base_url=...`` points at a vLLM
server.

Example
-------
>>> p = PRESETS["paper-table1"]
>>> len(p.models), p.settings["tasks"], p.settings["judge"]
(6, ['triviaqa_short', 'triviaqa_long', 'svamp_short', 'svamp_long', 'nq_open_short', 'nq_open_long'], 'meta-llama/Llama-3.1-70B,meta-llama/Llama-3.1-70B-Instruct')
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gnll._util.runfiles import RunDir
from gnll.semantic.nli import REFERENCE_NLI_MODEL

__all__ = [
    "PAPER_JUDGE",
    "PAPER_JUDGES",
    "PAPER_MODELS",
    "PRESETS",
    "Preset",
    "preset_configs",
    "run_preset",
]

#: The paper's six models (Sec. 5 "Models"): Llama-3.1 8B/70B and Falcon Mamba 7B, PT and IT.
PAPER_MODELS = (
    "meta-llama/Llama-3.1-8B",
    "meta-llama/Llama-3.1-8B-Instruct",
    "meta-llama/Llama-3.1-70B",
    "meta-llama/Llama-3.1-70B-Instruct",
    "tiiuae/falcon-mamba-7b",
    "tiiuae/falcon-mamba-7b-instruct",
)
#: "Llama-3.1 with 70 billion parameters as LLM-as-a-judge" (Sec. 5, App. D). Table 3 has separate
#: "LLM" and "LLM-Instruct" rows with different values and names no second judge; gnll's reading is
#: that the instruction-tuned model judged the "LLM-Instruct" rows (the label could also mean an
#: instruction-style prompt). Each judge gets its own rows, labelled by judge.
PAPER_JUDGES = ("meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-70B-Instruct")
PAPER_JUDGE = ",".join(PAPER_JUDGES)
_ALL_TASKS = [
    "triviaqa_short",
    "triviaqa_long",
    "svamp_short",
    "svamp_long",
    "nq_open_short",
    "nq_open_long",
]


@dataclass(frozen=True)
class Preset:
    """A named grid: models evaluated one after the other with the same :class:`EvalConfig` fields.

    Attributes
    ----------
    name, description:
        Registry name and one line for ``--help`` and the docs.
    models:
        The model of each run (hub ids, embedded names or local paths).
    settings:
        :class:`gnll.evaluation.run.runner.EvalConfig` fields every run gets (unless overridden).
    """

    name: str
    description: str
    models: tuple[str, ...]
    settings: dict[str, Any] = field(default_factory=dict)


_PAPER = {
    "tasks": _ALL_TASKS,
    "judge": PAPER_JUDGE,
    "beams": 5,
    "samples": 10,
    "temperature": None,
    "temperatures": (0.5, 1.0, 1.5),
    "heldout_size": 100,
    "clusterer": "nli",  # the paper's SE clusters by NLI (Sec. 2.2), not by embeddings
    # the paper names no NLI model; Farquhar et al.'s code, whose setup it follows, uses this one
    "clusterer_args": {"model": REFERENCE_NLI_MODEL},
    # the reference code's splits: SVAMP's test split, all NQ-Open validation questions (pools from
    # train), TriviaQA's 20% split (gnll.evaluation.data.datasets); needs the hub
    "data_source": "reference",
    # App. D: the temperature is searched "for each dataset"
    "temperature_scope": "dataset",
    "limit": None,
    "correctness": None,  # short: F1 and judge; long: judge (and Contains for reference)
    "f1_rule": "gt",
    "model_args": {"device": "auto", "dtype": "bfloat16"},
}

PRESETS: dict[str, Preset] = {
    "paper-table1": Preset(
        "paper-table1",
        "Table 1 (and Tables 2, 3, 4 from the same runs): six models x six tasks, F1 and "
        "LLM-as-a-judge, N=10 samples, K=5 beams",
        PAPER_MODELS,
        _PAPER,
    ),
    "paper-table1-short": Preset(
        "paper-table1-short",
        "Table 1's short-answer rows only (no judge needed for F1)",
        PAPER_MODELS,
        {**_PAPER, "tasks": [t for t in _ALL_TASKS if t.endswith("_short")], "judge": None},
    ),
    "paper-table5": Preset(
        "paper-table5",
        "Table 5: the Table 1 grid with the most likely of 5 beams as the reference answer",
        PAPER_MODELS,
        {**_PAPER, "reference": "beam"},
    ),
    "paper-llama-8b": Preset(
        "paper-llama-8b",
        "Table 1's two Llama-3.1-8B models (one GPU)",
        PAPER_MODELS[:2],
        _PAPER,
    ),
}


# The name this preset had while the docs numbered the paper's tables one too high.
PRESETS["paper-table6"] = dataclasses.replace(PRESETS["paper-table5"], name="paper-table6")


def slug(model: str) -> str:
    """A directory name for a model id or path.

    >>> slug("meta-llama/Llama-3.1-8B"), slug("/tmp/x/tiny-llama/")
    ('meta-llama--Llama-3.1-8B', 'tiny-llama')
    """
    p = Path(model)
    if p.is_absolute() or model.startswith("."):
        model = p.name
    return re.sub(r"[^A-Za-z0-9._-]+", "-", model.strip("/").replace("/", "--"))


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}") from None


def preset_configs(
    name: str, base: Any, explicit: Iterable[str] = (), models: Sequence[str] | None = None
) -> list[Any]:
    """One :class:`EvalConfig` per model of preset ``name``.

    ``base`` is the configuration built from the command line; its fields named in ``explicit``
    (given by the user) win over the preset's settings; ``models`` replaces the preset's models.
    Each run writes to ``base.output_path / slug(model)``. ``--data_dir``/``--data_path`` on the
    command line keep the data local (instead of the preset's ``data_source``); ``--clusterer``
    drops the preset's ``clusterer_args``.
    """
    preset = get_preset(name)
    explicit = set(explicit)
    changes = {k: v for k, v in preset.settings.items() if k not in explicit}
    # Local data given on the command line is what the user wants evaluated (the preset's hub
    # splits are the default only); another clusterer does not take the preset's NLI model.
    if explicit & {"data_dir", "data_path"}:
        changes.pop("data_source", None)
    if "clusterer" in explicit:
        changes.pop("clusterer_args", None)
    out = []
    for model in models or preset.models:
        out.append(
            dataclasses.replace(
                base, **changes, model=model, output_path=Path(base.output_path) / slug(model)
            )
        )
    return out


def run_preset(configs: Sequence[Any], output_path: str | Path) -> str:
    """Run every configuration in turn and write the merged ``table.md`` into ``output_path``."""
    from gnll.evaluation.results.report import averaged_significance, read_strata
    from gnll.evaluation.results.tables import render_table
    from gnll.evaluation.run.runner import Evaluator

    results = [Evaluator(cfg).run() for cfg in configs]
    strata = [read_strata(cfg.output_path) for cfg in configs]
    labels = [Path(cfg.output_path).name for cfg in configs]
    text = render_table(results, averaged_significance(results, strata), run_labels=labels)
    out = RunDir(output_path).table
    out.write_text(text, encoding="utf-8")
    return str(out)
