"""Estimating ``context_tokens`` of iterations from the request timelines of the same run.

vLLM's and SGLang's step logs give prefill/decode counts and durations but not the
KV context each step read.  When the same run also has request records on the same
clock (e.g. a vLLM server log plus per-request stats), each step's context is the
sum over requests running at the step's midpoint ``m`` of what they hold in KV
before the step:

* prefill phase (``t_scheduled <= m < t_first_token``): the share of the prompt
  computed so far, ``prompt_tokens * clip((t_start - t_scheduled) /
  (t_first_token - t_scheduled), 0, 1)``: 0 for a one-step prefill, ``j/n`` of
  the prompt at chunk ``j`` of ``n``;
* decode phase (``t_first_token <= m < t_finish``): ``prompt_tokens`` plus the
  output tokens emitted before ``m``: an ASOF join on the request's token times
  when it has them, else linear interpolation between first token and finish.

Only NULL ``context_tokens`` are filled (or ones this step filled before), and only
when most steps lie inside the requests' time span (clocks must agree).  The run's
``meta.estimated`` then lists ``context_tokens`` (next to what the converter
estimated) and ``meta.context_estimate`` says how; a run whose clocks do not overlap
gets ``context_estimate.skipped`` instead.  This metadata is the run's derived record
(``load.derive_run_meta``), so it survives a ``--replace`` of any of the run's files;
when a replace leaves the run without requests, the estimates are removed too.

The SQL is ``queries/ingest/context_candidates.sql`` (which runs qualify) and
``queries/ingest/context_estimate.sql`` (the estimate per step).
"""

from __future__ import annotations

import json

import duckdb

from .. import store
from ..store import scalar


def estimate_context(con: duckdb.DuckDBPyConnection, run_ids: list[str]) -> None:
    """POST_INGEST step: fill missing ``context_tokens`` of the touched runs (see module doc)."""
    rows = store.rows(con, "ingest/context_candidates", {"runs": run_ids})
    for run_id, n_iter, n_null, n_inside, n_req, was_estimated in rows:
        if not (n_null or was_estimated):
            continue
        if n_inside < 0.5 * n_iter:
            _derive(
                con,
                run_id,
                was_estimated,
                {
                    "skipped": f"only {n_inside} of {n_iter} steps lie inside the requests' time span; "
                    "iteration and request clocks differ, so context_tokens stays unknown"
                },
            )
            continue
        store.materialise(con, "ingest/context_estimate", {"run": run_id}, table="ctx_est", temp=True)
        cond = "" if was_estimated else "and i.context_tokens is null"
        con.execute(
            f"update iterations i set context_tokens = e.context_tokens from ctx_est e "
            f"where i.run_id = $run and i.iter = e.iter {cond}",
            {"run": run_id},
        )
        mean_active = scalar(con, "select avg(active_reqs) from ctx_est")
        _derive(
            con,
            run_id,
            True,
            {
                "method": "sum over requests running at each step's midpoint of prompt share computed "
                "(prefill) or prompt + tokens emitted (decode, ASOF join on token times)",
                "requests": int(n_req),
                "steps": int(n_iter),
                "mean_active_requests": round(float(mean_active or 0.0), 3),
            },
        )
        con.execute("drop table if exists ctx_est")
    # runs whose estimate lost its requests (a --replace removed them): the values go, not just the flag
    with_requests = [r[0] for r in rows]
    gone = [
        r[0]
        for r in con.execute(
            "select run_id from runs where run_id = any($runs) and not list_contains($kept, run_id) "
            "and list_contains(try_cast(json_extract(meta, '$.estimated') as varchar[]), 'context_tokens')",
            {"runs": run_ids, "kept": with_requests},
        ).fetchall()
    ]
    for run_id in gone:
        con.execute("update iterations set context_tokens = null where run_id = ?", [run_id])
        _derive(con, run_id, False, {"skipped": "no request records to estimate context_tokens from"})


def _derive(con: duckdb.DuckDBPyConnection, run_id: str, estimated: bool, how: dict) -> None:
    """Record on the run whether context_tokens is estimated (keeping other estimated fields) and how."""
    from .load import derive_run_meta

    meta = scalar(con, "select meta from runs where run_id = ?", [run_id])
    fields = [f for f in (json.loads(meta).get("estimated") or []) if f != "context_tokens"] if meta else []
    if estimated:
        fields.append("context_tokens")
    derive_run_meta(con, run_id, {"estimated": fields or None, "context_estimate": how})
