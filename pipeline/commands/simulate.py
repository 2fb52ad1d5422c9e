"""``tracelat simulate``: write a synthetic canonical trace with known ground truth."""

from __future__ import annotations

import sys

import click
from click.core import ParameterSource

from ..errors import writing
from ..settings import build, options
from ..sim.config import BURST_FIELDS, SYNTHETIC_FIELDS, Policy, WorkloadSpec
from ..sim.model import IterationModel, NoiseModel
from ..terminal import echo
from .options import seed_option


def _given(names: tuple[str, ...]) -> list[str]:
    """The options among the settings ``names`` that the command line gave, as written (``--rate``)."""
    ctx = click.get_current_context()
    return [
        p.opts[0]
        for p in ctx.command.params
        if p.name in names
        and ctx.get_parameter_source(p.name) not in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP)
    ]


@click.command()
@click.option(
    "--out",
    default="sim.jsonl",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="Trace file to write (canonical JSON Lines; a .gz name is gzip-compressed).",
)
@click.option(
    "--truth",
    type=click.Path(dir_okay=False),
    help="Ground-truth JSON (parameters, injected stalls). Default: <out stem>.truth.json.",
)
@click.option("--run-id", help="Run id written in the trace. Default: the trace file's stem.")
@click.option(
    "--iterations",
    type=click.IntRange(min=1),
    help="Stop after this many engine steps (the workload is sized to last that long).",
)
# one option per field of the simulator's settings, declared with the fields (pipeline/sim/config.py, model.py)
@options(WorkloadSpec)
@options(Policy)
@options(IterationModel)
@options(NoiseModel)
@seed_option("Random seed; the same seed and options give the same trace.")
@click.option("--no-token-times", is_flag=True, help="Leave out per-token times (much smaller files for long runs).")
def simulate(**o) -> None:
    """Simulate a continuous-batching LLM server (vLLM-like) and write a canonical trace.

    Decodes go first in every step, then prefill chunks fill the token budget
    FCFS; KV is held in blocks and overflow preempts the newest request (recompute). Iteration time is
    t0 + a*context + b*prefill + c*decode (+ d*requests + e*prefill attention pairs, 0 by default),
    times log-normal (or Student-t) noise, plus injected stalls. The truth file lists every parameter
    and every injected stall.

    \b
    Examples:
      tracelat simulate --requests 500 --rate 8 --out run.jsonl
      tracelat simulate --iterations 1000000 --no-token-times --out big.jsonl.gz
      tracelat simulate --burst-at 60 --burst-count 30 --stall-rate 0.001
    """
    from pipeline.sim import run_simulation

    if o["lengths_file"] and (given := _given(SYNTHETIC_FIELDS)):
        raise click.UsageError(
            f"{', '.join(given)} shape a synthetic workload; --lengths-file takes arrivals and lengths from "
            "the file. Leave them out (to change the arrival rate, scale the file's arrival times)"
        )
    if o["burst_at_s"] is None and (given := _given(BURST_FIELDS)):
        raise click.UsageError(
            f"{', '.join(given)} {'shapes' if len(given) == 1 else 'shape'} the burst that --burst-at injects; "
            "without --burst-at there is no burst. Add --burst-at SECONDS, or leave "
            f"{'it' if len(given) == 1 else 'them'} out"
        )
    # a rate of 0 typed out is a sweep's point (a script stepping --stall-rate): only the default is refused
    if o["stall_rate"] == 0 and _given(("stall_ms_mean",)) and not _given(("stall_rate",)):
        raise click.UsageError(
            "--stall-ms sizes the stalls that --stall-rate injects; with a stall rate of 0 (the default) none is "
            "injected. Add --stall-rate P (a probability per step, e.g. 0.001), or leave --stall-ms out"
        )
    if o["law"] != "t" and _given(("df",)):
        raise click.UsageError(
            f"--noise-df is the degrees of freedom of the t law; the noise law is {o['law']}. "
            "Add --noise-law t, or leave --noise-df out"
        )
    try:
        spec, policy = build(WorkloadSpec, o), build(Policy, o)
        model, noise = build(IterationModel, o), build(NoiseModel, o)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    kwargs = dict(
        truth=o["truth"],
        run_id=o["run_id"],
        spec=spec,
        policy=policy,
        model=model,
        noise=noise,
        seed=o["seed"],
        iterations=o["iterations"],
        with_token_times=not o["no_token_times"],
    )
    try:
        if o["iterations"]:  # a known length: show a progress bar (on a terminal)
            with click.progressbar(length=o["iterations"], label="simulating", file=sys.stderr) as bar:
                with writing("--out", o["out"]):
                    run = run_simulation(o["out"], progress=lambda k: bar.update(max(k - bar.pos, 0)), **kwargs)
        else:
            with writing("--out", o["out"]):
                run = run_simulation(o["out"], **kwargs)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    echo(run.summary_line())
