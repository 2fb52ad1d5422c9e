"""``tracelat fit``: fit the memory-bound iteration-time model to a run."""

from __future__ import annotations

from pathlib import Path

import click

from ..catalog import HardwareSpec
from ..defaults import STALL_FDR  # not pipeline.fit.stalls: that imports the fit stack
from ..settings import build, options
from ..terminal import echo
from .options import db_option, dumps, json_option, lake_option, open_source


@click.command()
@click.argument("run_id")
@options(HardwareSpec)
@click.option(
    "--fdr",
    "fdr",
    type=click.FloatRange(min=0, max=1, min_open=True, max_open=True),
    default=STALL_FDR,
    show_default=True,
    help="Stall detection: the expected share of false stalls among the flagged steps (Benjamini-Hochberg "
    "over p-values from the run's fitted noise law). Lower flags fewer small stalls.",
)
@click.option(
    "--k",
    "k",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Deprecated: a fixed threshold of k robust standard deviations instead of --fdr (its false "
    "stalls grow with the run's length).",
)
@click.option(
    "--bootstrap", type=click.IntRange(min=10), default=200, show_default=True, help="Bootstrap replicates for the CIs."
)
@db_option
@lake_option
@json_option
def fit(run_id: str, fdr, k, bootstrap, db: str, lake: Path | None, as_json: bool, **hardware) -> None:
    """Fit iteration_ms ~ t0 + a*context + b*prefill + c*decode to RUN_ID.

    Robust (outliers are the stalls being hunted), with bootstrap confidence
    intervals, R² and MAPE; the effective KV bandwidth, weight-read floor and
    prefill roofline against the GPU; the iteration-time claims checked on the
    data; spikes labelled prefill / preemption / unexplained. Stores the fit and
    the per-step and per-request parts for `tracelat explain` and reports.
    """
    from ..errors import InputError
    from ..fit import fit_run
    from ..fit.text import format_fit

    fdr_given = click.get_current_context().get_parameter_source("fdr") is click.core.ParameterSource.COMMANDLINE
    if k is not None and fdr_given:
        raise InputError(f"--k {k} and --fdr {fdr} are two stall rules; give one (--fdr is the current one)")
    if k is not None:
        click.echo(
            "Warning: --k is deprecated; it replaces the false-discovery-rate rule (--fdr) for this fit", err=True
        )
    hw = build(HardwareSpec, hardware)
    if hw.model and hw.config:
        raise InputError("give --model or --config, not both")
    con = open_source(db, lake, [run_id])  # read-write: the fit is stored (in memory for a lake)
    result = fit_run(con, run_id, hw, k=k, fdr=fdr, n_boot=bootstrap)
    echo(dumps(result.to_dict()) if as_json else format_fit(result))
