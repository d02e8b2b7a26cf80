"""Smoke tests of ``gnll simulate`` through Typer's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gnll.cli.main import app

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURES = (
    "fig1a_entropy.png",
    "fig1b_max.png",
    "fig3_dirichlet_next_tokens.png",
    "fig4_entropy_grid.png",
    "fig4_entropy_grid_quantiles.png",
    "fig5_max_grid.png",
    "found_max_fraction.png",
)


def _invoke(*args: str):
    return CliRunner().invoke(app, ["simulate", *args])


def test_simulate_quick_writes_results_and_figures(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    res = _invoke(
        "--quick", "--distributions", "6", "--workers", "1", "--no-progress",
        "--output_path", str(out),
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    data = json.loads((out / "results.json").read_text())
    assert set(data) >= {"format_version", "config", "settings", "claims", "wall_time_s"}
    assert set(data["settings"]) == {"V20_T2", "V20_T3", "V100_T2", "V100_T3"}
    s = data["settings"]["V100_T3"]
    assert s["distributions"] == 6
    assert set(s["estimators"]) >= {"m_beam", "pe_ms_tau1", "pe_ms_tau0.5", "m_ms_tau0.1"}
    beam = s["estimators"]["m_beam"]
    assert len(beam["found_max_fraction"]) == 10
    assert set(beam["error"]) == {"mean", "std", "q05", "q50", "q95"}
    assert set(data["claims"]) == {"claim1_greedy_finds_max", "claim2_pe_spread"}
    assert s["theory"]["n_distributions"] == 3
    for name in FIGURES:
        blob = (out / name).read_bytes()
        assert blob.startswith(PNG_MAGIC) and len(blob) > 5000, name
    assert "greedy" in res.output and "Theorem 1" in res.output


def test_simulate_hyphen_alias_and_custom_settings(tmp_path: Path) -> None:
    out = tmp_path / "alias"
    res = _invoke(
        "--output-path", str(out), "--vocab-sizes", "20", "--lengths", "2",
        "--distributions", "4", "--max-samples", "3", "--theory-distributions", "0",
        "--workers", "1", "--no-progress", "--no-plots",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    data = json.loads((out / "results.json").read_text())
    assert list(data["settings"]) == ["V20_T2"]
    assert data["config"]["max_samples"] == 3
    assert not (out / "fig1a_entropy.png").exists()


def test_simulate_rejects_bad_input(tmp_path: Path) -> None:
    res = _invoke("--vocab_sizes", "twenty", "--output_path", str(tmp_path), "--no-progress")
    assert res.exit_code != 0
    res = _invoke("--distributions", "0", "--output_path", str(tmp_path), "--no-progress")
    assert res.exit_code != 0
    assert not (tmp_path / "results.json").exists()
