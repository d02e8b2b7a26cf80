"""``gnll simulate``: the synthetic study of Sec. 3 / App. B-C (exact ground truth, Theorem 1).

Example
-------
``gnll simulate --quick --output /tmp/sim`` writes ``/tmp/sim/results.json`` and the PNG
figures in a few seconds; without ``--quick`` it runs the paper's full study (2,000 distributions
per setting).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from gnll._util.runfiles import RESULTS
from gnll.cli._args import parse_list

__all__ = ["simulate"]


def _fmt(x: Any, digits: int = 2) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _print_summary(results: dict[str, Any], output_path: Path, files: list[Path]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:  # logs and CliRunner: do not squeeze the tables to 80 columns
        console = Console(width=150)
    cfg = results["config"]
    n_max = cfg["max_samples"]
    claims = results["claims"]
    c1 = claims["claim1_greedy_finds_max"]["per_setting"]
    c2 = claims["claim2_pe_spread"]["per_setting"]
    low = min(cfg["pe_temperatures"])
    ms_low = min(cfg["ms_temperatures"])
    table = Table(
        title=f"Simulation study ({cfg['distributions']} distributions/setting, N<= {n_max})"
    )
    for col in (
        "setting",
        "H mean",
        "M mean",
        "greedy=max",
        "beam2=max",
        f"beam{n_max}=max",
        f"MS tau={ms_low:g} N={n_max}",
        "PE tau=1 std N=1",
        f"N={n_max}",
        f"PE tau={low:g} std N={n_max}",
        f"no-IS tau={low:g} std / mean err N={n_max}",
    ):
        table.add_column(col, justify="right")
    for key, s in results["settings"].items():
        r1, r2 = c1[key], c2[key]
        pe1 = r2.get("pe_ms_tau1", {})
        pel = r2.get(f"pe_ms_tau{low:g}", {})
        naive = r2.get(f"pe_ms_naive_tau{low:g}")
        table.add_row(
            key,
            _fmt(s["exact"]["entropy"]["mean"]),
            _fmt(s["exact"]["min_entropy"]["mean"]),
            _fmt(r1["greedy"], 3),
            _fmt(r1["beam2"], 3),
            _fmt(r1["beam_max"], 3),
            _fmt(r1.get(f"m_ms_tau{ms_low:g}_nmax"), 3),
            _fmt(pe1.get("std_n1")),
            _fmt(pe1.get("std_nmax")),
            _fmt(pel.get("std_nmax")),
            f"{_fmt(naive['std_nmax'])} / {_fmt(naive['mean_error_nmax'])}" if naive else "-",
        )
    console.print(table)

    delta = cfg["theory_delta"]
    th = Table(title=f"Theorem 1 check (eps={cfg['theory_epsilon']}, delta={delta})")
    for col in (
        "setting",
        "tau",
        "#p",
        "M: pooled fail rate",
        "max analytic fail",
        "N_bound/N_req (median)",
        "H: log10 N_Hoeffding (median)",
        "log10 N_H/N_clt",
    ):
        th.add_column(col, justify="right")
    for key, s in results["settings"].items():
        t = s["theory"]
        if not t.get("n_distributions"):
            continue
        for tau, rec in t["max"].items():
            ent = t["entropy"].get(tau, {})
            th.add_row(
                key,
                tau,
                str(t["n_distributions"]),
                _fmt(rec["pooled_empirical_failure"], 3),
                _fmt(rec["max_analytic_failure"], 3),
                _fmt(rec["bound_over_required"]["q50"]),
                _fmt((ent.get("log10_n_hoeffding") or {}).get("q50"), 1),
                _fmt((ent.get("log10_hoeffding_over_clt") or {}).get("q50"), 1),
            )
    console.print(th)
    v = claims["claim1_greedy_finds_max"]["verdicts"]
    for thr, verdict in v.items():
        console.print(
            f"claim 1 @ {thr}: greedy misses in {verdict['greedy_misses'] or 'no setting'}; "
            f"beam-2 rescues {verdict['beam2_finds_where_greedy_misses'] or 'none'}; "
            f"'all but one' holds: {verdict['holds_all_but_one']}"
        )
    cl2 = claims["claim2_pe_spread"]
    console.print(
        f"claim 2: lower temperature gives a larger PE error std in every setting: "
        f"{cl2['lower_temperature_larger_std_all_settings']}; larger 5-95% width: "
        f"{cl2['lower_temperature_larger_width90_all_settings']}"
    )
    console.print(
        f"wrote {output_path / RESULTS} and {len(files)} figures in {results['wall_time_s']:.1f} s"
    )


def simulate(
    output_path: Annotated[
        Path,
        typer.Option("--output_path", "--output-path", help="Directory for results.json and PNGs."),
    ] = Path("simulation_results"),
    distributions: Annotated[
        int | None,
        typer.Option("--distributions", help="Random p(y) per setting (default 2000; quick 20)."),
    ] = None,
    vocab_sizes: Annotated[
        str | None,
        typer.Option("--vocab_sizes", "--vocab-sizes", help="Comma list (default 20,100)."),
    ] = None,
    lengths: Annotated[
        str | None, typer.Option("--lengths", help="Comma list of T (default 2,3,4; quick 2,3).")
    ] = None,
    max_samples: Annotated[
        int | None,
        typer.Option("--max_samples", "--max-samples", help="N_max (samples / beam width) [10]."),
    ] = None,
    repeats: Annotated[
        int | None,
        typer.Option(
            "--repeats",
            help="Sample sets per distribution [1]; appendix: --distributions 1 --repeats 2000.",
        ),
    ] = None,
    pe_temperatures: Annotated[
        str | None,
        typer.Option(
            "--pe_temperatures", "--pe-temperatures", help="MS temperatures for PE [1.0,0.5]."
        ),
    ] = None,
    ms_temperatures: Annotated[
        str | None,
        typer.Option(
            "--ms_temperatures",
            "--ms-temperatures",
            help="MS temperatures for the max estimator [1.0,0.5,0.1].",
        ),
    ] = None,
    theory_distributions: Annotated[
        int | None,
        typer.Option(
            "--theory_distributions",
            "--theory-distributions",
            help="Distributions per setting for the Theorem 1 check [100; quick: 3].",
        ),
    ] = None,
    epsilon: Annotated[
        float | None, typer.Option("--epsilon", help="Theorem 1 accuracy eps in nats [0.1].")
    ] = None,
    delta: Annotated[float | None, typer.Option("--delta", help="Theorem 1 delta [0.1].")] = None,
    leaf_pool_size: Annotated[
        int | None,
        typer.Option(
            "--leaf_pool_size",
            "--leaf-pool-size",
            help="Leaf pool rows for settings with |V|^T > 1e7 [2^20]; 0 = fresh draws "
            "everywhere (exact prior; hours for |V|=100, T=4).",
        ),
    ] = None,
    pool_threshold: Annotated[
        int | None,
        typer.Option(
            "--pool_threshold",
            "--pool-threshold",
            help="Use the leaf pool for settings with |V|^T above this [1e7].",
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Master seed.")] = 0,
    workers: Annotated[int, typer.Option("--workers", help="Worker processes.")] = 2,
    quick: Annotated[
        bool, typer.Option("--quick", help="Small study (a few seconds) for tests and the README.")
    ] = False,
    plots: Annotated[
        bool, typer.Option("--plots/--no-plots", help="Write the PNG figures.")
    ] = True,
    progress: Annotated[
        bool, typer.Option("--progress/--no-progress", help="Show a progress bar.")
    ] = True,
) -> None:
    """Reproduce the synthetic study (Fig. 1, App. C Figs. 4-5) and check Theorem 1 (App. B)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from gnll.simulation.study import StudyConfig, run_study, write_results

    overrides: dict[str, Any] = {
        "distributions": distributions,
        "vocab_sizes": parse_list(vocab_sizes, int, "--vocab_sizes"),
        "lengths": parse_list(lengths, int, "--lengths"),
        "max_samples": max_samples,
        "repeats": repeats,
        "pe_temperatures": parse_list(pe_temperatures, float, "--pe_temperatures"),
        "ms_temperatures": parse_list(ms_temperatures, float, "--ms_temperatures"),
        "theory_distributions": theory_distributions,
        "theory_epsilon": epsilon,
        "theory_delta": delta,
        "leaf_pool_size": leaf_pool_size,
        "pool_threshold": pool_threshold,
        "seed": seed,
        "workers": workers,
    }
    overrides = {k: v for k, v in overrides.items() if v is not None}
    try:
        config = StudyConfig.quick(**overrides) if quick else StudyConfig(**overrides)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc

    start = time.perf_counter()
    total = config.distributions * len(config.settings())
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=not progress,
        transient=False,
    ) as bar:
        task = bar.add_task("simulating", total=total)

        def _on_progress(key: str, n_done: int, _n_total: int) -> None:
            bar.update(task, advance=n_done, description=f"simulating {key}")

        results = run_study(config, progress=_on_progress)
    files: list[Path] = []
    if plots:
        from gnll.simulation.plots import make_figures

        files = make_figures(results, output_path)
    results["wall_time_s"] = time.perf_counter() - start
    write_results(results, output_path)
    _print_summary(results, output_path, files)
