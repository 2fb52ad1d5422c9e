"""``tracelat replay``: replay a recorded run through the simulator (validation, what-if, sweeps)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import click

from ..errors import InputError, writing
from ..settings import finite_float, given, options
from ..sim.config import Policy
from ..terminal import echo, inline
from .options import db_option, lake_option, open_source, dumps, json_option


def _unset(f) -> str:
    """What a policy option left out means in a replay: the recorded value, else Policy's ``unrecorded``."""
    if "unrecorded" not in f.metadata:
        return "recorded"
    v = f.metadata["unrecorded"]
    return f"recorded, else {('on' if v else 'off') if isinstance(v, bool) else v}"


SWEEP_HELP = (
    "What-if sweep of one setting: " + ", ".join(Policy.__dataclass_fields__) + ", "
    "e.g. max_num_batched_tokens=256,512,1024,2048; or a hardware what-if: kv_dtype=bf16,fp8, "
    "compute_speedup=1,2."
)


def _seed_path(out: Path, seed: int, n_seeds: int) -> Path:
    """``out`` itself for one seed, else ``<stem>-seed<k><suffixes>`` (``x.jsonl.gz`` -> ``x-seed1.jsonl.gz``)."""
    if n_seeds == 1:
        return out
    from ..sim import split_trace_name

    stem, suffix = split_trace_name(out.name)
    return out.with_name(f"{stem}-seed{seed}{suffix}")


@click.command()
@click.argument("run_id", metavar="RUN")
@db_option
@lake_option
@options(Policy, unset=_unset)
@click.option(
    "--kv-dtype",
    metavar="DTYPE",
    help="What-if KV-cache dtype (fp8, bf16, fp32, int4, ...): the fitted KV read per context token (a) "
    "scales by bytes(DTYPE) / bytes(recorded KV dtype), the KV capacity in tokens by the inverse unless "
    "--kv-capacity-tokens is given. See docs/replay.md.",
)
@click.option(
    "--recorded-kv-dtype",
    metavar="DTYPE",
    help="The KV dtype the run used, for --kv-dtype (default: runs.kv_dtype, else runs.dtype, else bf16 with a note).",
)
@click.option(
    "--compute-speedup",
    metavar="X",
    type=finite_float(min=0, min_open=True),
    help="What-if compute X times faster: the FLOP-bound terms (b prefill, c decode, e prefill attention) "
    "divided by X; t0, a (memory reads) and d unchanged.",
)
@click.option(
    "--iteration-model",
    type=click.Choice(["auto", "memory-bound", "extended"]),
    default="auto",
    show_default=True,
    help="Step-time model to replay with. auto: the extended model (per-request and prefill-attention "
    "terms) when it predicts held-out steps better, else the memory-bound one. See docs/replay.md.",
)
@click.option(
    "--noise",
    type=click.Choice(["fitted", "none"]),
    default="fitted",
    show_default=True,
    help="fitted: the fit's residual spread and stalls; none: the model's mean step time only.",
)
@click.option(
    "--seeds",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Replays per setting (seeds --seed .. --seed+K-1); their spread is reported.",
)
@click.option("--seed", "first_seed", type=click.IntRange(min=0), default=0, show_default=True, help="First seed.")
@click.option(
    "--ok-only",
    is_flag=True,
    help="Replay only requests that were ok in the recording "
    "(default: failed/aborted ones are replayed as load, not compared). Not with --workload: "
    "a workload file's requests have no recorded status.",
)
@click.option("--sweep", "sweep_spec", metavar="NAME=V1,V2,...", help=SWEEP_HELP)
@click.option(
    "--slo",
    type=click.Path(dir_okay=False),
    help="SLO file (as for tracelat audit): with --sweep, mark "
    "which swept settings meet it; in a validation replay, set the run's goodput beside the replay's "
    "(needs [goodput]; its [slo] limits and [fluidity] are noted as unused there).",
)
@click.option(
    "--chart",
    type=click.Path(dir_okay=False),
    help="Sweep chart (self-contained HTML). Default: reports/<RUN>/replay-sweep-<NAME>.html.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write each replay as a canonical trace (.gz compresses); with several seeds, -seed<k> is added to the name.",
)
@click.option("--ingest", "do_ingest", is_flag=True, help="Also ingest the replay traces into --db.")
@click.option(
    "--workload",
    "workload_file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Replay this workload instead of the run's own requests, with the run's fitted model: a "
    "Mooncake-style JSONL (timestamp ms, input_length, output_length; hash_ids replay a prefix cache), or any file `tracelat "
    "simulate --lengths-file` reads (CSV, JSONL, Parquet; Azure and Splitwise traces).",
)
@click.option(
    "--no-token-times",
    is_flag=True,
    help="Leave per-token times out of the traces --out writes or --ingest stores (smaller; needs one of them).",
)
@json_option
def replay(
    run_id: str,
    db: str,
    lake: Path | None,
    noise: str,
    seeds: int,
    first_seed: int,
    ok_only: bool,
    sweep_spec: str | None,
    slo: str | None,
    chart: str | None,
    out: Path | None,
    do_ingest: bool,
    workload_file: Path | None,
    no_token_times: bool,
    as_json: bool,
    kv_dtype: str | None,
    recorded_kv_dtype: str | None,
    compute_speedup: float | None,
    iteration_model: str,
    **policy_options,
) -> None:
    """Replay RUN's arrivals and sizes through the simulator with RUN's fitted iteration model.

    With the recorded policy (no policy option) this validates the model: observed
    vs replayed TTFT/TPOT/ITL/E2E p50/p90/p99 and throughput, with relative errors
    and the spread over seeds. With a policy option it answers a what-if. With
    --sweep it replays each value of one setting, prints a table, writes a chart
    and, with --slo, marks the settings that meet the SLOs. See docs/replay.md.

    \b
    Examples:
      tracelat replay RUN                                   # validation, 3 seeds
      tracelat replay RUN --max-num-batched-tokens 512 --out whatif.jsonl --ingest
      tracelat replay RUN --sweep max_num_batched_tokens=256,512,1024,2048 --slo slo.toml
      tracelat replay RUN --kv-dtype fp8                      # KV cache in fp8 instead of bf16
      tracelat replay RUN --sweep kv_dtype=bf16,fp8
      tracelat replay RUN --workload mooncake_trace.jsonl     # another workload, this engine
    """
    from .. import store
    from ..fit import fit_ready
    from ..replay import calibrate, compare, ingest_replay, replay_run_id, write_replay

    if sweep_spec and (out or do_ingest):
        raise InputError("--sweep does not write traces; replay one setting with --out (and --ingest) instead")
    if do_ingest and lake is not None:
        raise InputError(
            "--ingest writes the replay into a store; with --lake, write it with --out and ingest "
            "that file with `tracelat ingest FILE --lake DIR`"
        )
    if no_token_times and sweep_spec:
        raise InputError("--no-token-times is for the traces --out writes; --sweep writes none: leave it out")
    if no_token_times and out is None and not do_ingest:
        raise InputError(
            "--no-token-times leaves per-token times out of the replay traces that --out writes and --ingest "
            "stores; without either no trace is written, so it changes nothing: leave it out, or add --out FILE "
            "(or --ingest)"
        )
    if ok_only and workload_file is not None:
        raise InputError(
            "--ok-only drops the failed and aborted requests of RUN's recording, which --workload replaces: "
            "every request of the workload file is replayed (a file has no recorded status); leave --ok-only "
            "out, or take the requests you do not want out of the file"
        )
    if chart and not sweep_spec:
        raise InputError(
            "--chart goes with --sweep; for a single replay use --out --ingest and tracelat report on the replay run"
        )
    goodput_spec, slo_unused = None, ""
    if slo and not sweep_spec:  # a single replay: goodput observed vs replayed in the calibration
        from ..slo import load_slo
        from ..terminal import inline

        spec = load_slo(slo)
        goodput_spec = spec.goodput
        if goodput_spec is None:
            raise InputError(
                f"{inline(slo)}: without --sweep, --slo compares goodput observed vs replayed and needs a [goodput] "
                "section"
            )
        unused = [f"{len(spec.limits)} [slo] limit(s)"] if spec.limits else []
        unused += ["[fluidity]"] if spec.fluidity is not None else []
        if unused:
            slo_unused = (
                f"--slo: a single replay uses the file's [goodput] only, not its {' and '.join(unused)}: judge "
                "them with tracelat audit on the replay (--ingest), or mark swept settings with --sweep NAME=... --slo"
            )
    overrides = given(Policy, policy_options)  # None: not given (recorded)
    whatif = {"kv_dtype": kv_dtype, "compute_speedup": compute_speedup}  # None: not given
    if sweep_spec:
        from ..replay import parse_sweep

        param, swept = parse_sweep(sweep_spec)
        given_value = {**overrides, **whatif}.get(param)
        if given_value is not None:  # the sweep would replace it without a word
            name = param.replace("_", "-")
            opt = (
                f"--{name} {given_value}"
                if not isinstance(given_value, bool)
                else f"--{'' if given_value else 'no-'}{name}"
            )
            fix = (
                "leave it out"
                if given_value in swept
                else f"put {given_value} among the sweep's values, or leave it out"
            )
            raise InputError(f"{opt} and --sweep {sweep_spec} both set {param}; {fix}")
    if recorded_kv_dtype and not kv_dtype and not (sweep_spec and param == "kv_dtype"):
        raise InputError("--recorded-kv-dtype goes with --kv-dtype DTYPE or --sweep kv_dtype=...")
    from ..replay.whatif import dtype_bytes_strict

    for opt, name in (("--kv-dtype", kv_dtype), ("--recorded-kv-dtype", recorded_kv_dtype)):
        if name:  # before the store is opened and the run fitted
            dtype_bytes_strict(name, opt)
    con = open_source(db, lake, [run_id], None if do_ingest else fit_ready(run_id))
    tmp = None  # the scratch folder, once made; removed however the replay ends
    try:
        try:
            cal = calibrate(
                con,
                run_id,
                overrides,
                noise=noise,
                ok_only=ok_only,
                whatif=whatif,
                recorded_kv_dtype=recorded_kv_dtype,
                iteration_model=iteration_model,
            )
        except InputError as exc:
            block = overrides.get("kv_block_size")
            if not (sweep_spec and param == "kv_capacity_tokens" and block is not None and "kv_block_size" in str(exc)):
                raise
            # --kv-block-size above the recorded capacity: the sweep replaces the capacity, so
            # calibrate at the largest swept one; run_sweep checks the block size against each value
            try:
                cal = calibrate(
                    con,
                    run_id,
                    {**overrides, "kv_capacity_tokens": max(swept)},
                    noise=noise,
                    ok_only=ok_only,
                    whatif=whatif,
                    recorded_kv_dtype=recorded_kv_dtype,
                    iteration_model=iteration_model,
                )
            except InputError:
                raise exc from None
            cal.notes.append(
                f"--kv-block-size {block} is above the recorded kv_capacity_tokens; each row runs its swept "
                f"capacity (the policy shown carries the largest, {max(swept)})"
            )
        if workload_file is not None:
            from ..sim.workload import workload_from_file

            cal = cal.with_workload(workload_from_file(workload_file), workload_file.name)
        seed_list = list(range(first_seed, first_seed + (1 if noise == "none" else seeds)))
        if noise == "none" and seeds > 1:
            cal.notes.append("--noise none: every seed gives the same replay, so one seed was run")
        seed_source = click.get_current_context().get_parameter_source("first_seed")
        if noise == "none" and seed_source is click.core.ParameterSource.COMMANDLINE:
            cal.notes.append(
                f"--noise none: the replay draws nothing at random, so --seed {first_seed} replays what any seed "
                "does (it only names the run id)"
            )
        if sweep_spec:
            from ..replay.validate import observed_stats

            _sweep(cal, sweep_spec, seed_list, slo, chart, as_json, observed_stats(con, run_id))
            return
        tmp = replay_temp_dir() if do_ingest and out is None else None
        target = out if out is not None else (Path(tmp.name) / "replay.jsonl" if tmp else None)
        written: list[Path] = []

        def write(seed, result, stats) -> None:
            if target is not None:
                with writing("--out", target):
                    written.append(
                        write_replay(
                            result,
                            _seed_path(target, seed, len(seed_list)),
                            replay_run_id(cal, seed),
                            cal,
                            seed,
                            con,
                            not no_token_times,
                        )
                    )

        if slo_unused:
            cal.notes.append(slo_unused)
        base = _as_recorded(con, cal, run_id, overrides, noise, ok_only, recorded_kv_dtype, iteration_model)
        cmp = compare(con, cal, seed_list, write, goodput_spec=goodput_spec, as_recorded=base)
        if goodput_spec is not None and cmp.goodput_observed is None:
            cal.notes.append(
                "--slo: goodput is compared in a validation replay of the run's own requests "
                "(recorded policy); for what-ifs use --sweep NAME=... --slo"
            )
        cmp.run_ids = [replay_run_id(cal, s) for s in seed_list]
        cmp.kept = target is not None
        if do_ingest:
            for p, rid in zip(written, cmp.run_ids):
                ingest_replay(con, p, rid)
    finally:
        if tmp is not None:
            tmp.cleanup()
        con.close()
    if as_json:
        d = cmp.to_dict()
        d["written"] = [str(p) for p in written if out is not None]
        d["ingested"] = do_ingest
        echo(dumps(d))
        return
    echo(cmp.format())
    if out is not None:
        echo("wrote " + ", ".join(str(p) for p in written))
    if do_ingest:
        echo(f"ingested into {store.db_path(db)}: " + ", ".join(cmp.run_ids))


TEMP_PREFIX = "tracelat-replay-"


def replay_temp_dir() -> tempfile.TemporaryDirectory:
    """The scratch folder of ``replay --ingest`` (traces of several MB), named with our pid.

    A killed replay cannot remove its folder, so each replay first removes the folders of
    replays whose process is gone (only this user's)."""
    remove_stale_temp_dirs()
    return tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}{os.getpid()}-")


def remove_stale_temp_dirs(root: Path | None = None) -> list[Path]:
    import shutil

    removed = []
    base = Path(root or tempfile.gettempdir())
    for d in base.glob(f"{TEMP_PREFIX}*-*"):
        pid = d.name[len(TEMP_PREFIX) :].split("-", 1)[0]
        try:
            if not pid.isdigit() or not d.is_dir() or d.is_symlink() or d.stat().st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)  # raises when no such process: the replay that made it is gone
            continue
        except ProcessLookupError:
            pass
        except OSError:  # PermissionError: the process exists (another user's); or d vanished
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def _as_recorded(con, cal, run_id, overrides, noise, ok_only, recorded_kv_dtype, iteration_model):
    """For a what-if: the same replay at the recorded policy, without hardware what-ifs, on the run's
    own requests (the options that fill what the run does not record are kept). None for a
    validation replay, or (with a note) when the recorded policy cannot be replayed."""
    from ..replay import calibrate

    if not cal.is_what_if:
        return None
    try:
        base = calibrate(
            con,
            run_id,
            overrides,
            noise=noise,
            ok_only=ok_only,
            recorded_kv_dtype=recorded_kv_dtype,
            iteration_model=iteration_model,
        )
        return base.with_policy(**{f: base.baseline_policy[f] for f in base.policy_changes()})
    except InputError as exc:
        cal.notes.append(f"the change is against the run itself: the recorded policy cannot be replayed ({exc})")
        return None


def _sweep(
    cal, spec: str, seeds: list[int], slo_path: str | None, chart: str | None, as_json: bool, observed: dict
) -> None:
    from ..slo import load_slo
    from ..replay import parse_sweep, run_sweep
    from ..report.sweep_chart import save_chart

    param, values = parse_sweep(spec)
    slo = load_slo(slo_path) if slo_path else None
    sw = run_sweep(cal, param, values, seeds, slo)
    sw.observed = observed
    from ..report.render import default_out_dir

    chart_path = chart or default_out_dir(cal.run_id) / f"replay-sweep-{param}.html"
    with writing("--chart", chart_path):
        path = save_chart(sw, chart_path)
    if as_json:
        echo(dumps(sw.to_dict() | {"chart": str(path)}))
        return
    echo(sw.format())
    echo(f"\nchart: {inline(path)}")
