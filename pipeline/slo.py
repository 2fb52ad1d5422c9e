"""SLO files (TOML with ``[slo]``, ``[goodput]`` and ``[fluidity]`` sections) and goodput.

The audit, replay sweeps and the fleet all judge goodput with :func:`goodput` here.

The layout (docs/reports-and-audit.md, examples/slo.toml)::

    [slo]                       # upper limits on run-level statistics, <metric>.<stat> = limit
    ttft_ms.p99 = 2000
    [goodput]                   # per-request limits; a request is good when it meets all of them
    ttft_ms = 2000
    tpot_ms = 100
    min_attainment = 0.99
    [fluidity]                  # Etalon fluidity index: per-token deadlines with slack
    ttft_deadline_ms = 2000
    tbt_deadline_ms = 100
    min_index_p01 = 0.9

Every problem is reported as an :class:`~pipeline.errors.InputError` naming the
file, the section and the key, with the accepted values: among them an SLO written twice
(``ttft_ms.p99`` and ``"ttft_ms.p99"``, or ``p99`` and ``p990``, name the same one), a
limit out of its range (milliseconds and deadlines > 0, ``std`` >= 0, rates >= 0,
fractions 0..1) and a ``[fluidity]`` section with deadlines but no limit to check.
"""

from __future__ import annotations

import json

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from .errors import InputError
from .metrics import METRICS, REQUEST_METRICS, percentile_name, percentile_of

# Run-level metrics an [slo] limit may name: every distribution of the registry.
SLO_METRICS = METRICS
PLAIN_STATS = ("mean", "std", "max", "min")
# Per-request metrics a [goodput] limit may name (columns of request_latency).
GOODPUT_METRICS = REQUEST_METRICS
# A latency within this many ms of its limit meets it. Times are float seconds (since the epoch
# in most logs, about 0.2 us apart there): a TPOT of exactly 100 ms can come out as
# 100.00000000000001 and failed `tpot_ms.p99 = 100`. One microsecond is below any clock a
# serving log keeps and far below any latency limit worth writing.
TIE_MS = 1e-3


def within_limit(value_ms: float, limit_ms: float) -> bool:
    """``value_ms <= limit_ms``, up to the float rounding of times (:data:`TIE_MS`)."""
    return value_ms <= limit_ms + TIE_MS


GOODPUT_MINIMA = ("min_attainment", "min_request_goodput_rps", "min_token_goodput_tps")
SECTIONS = ("slo", "goodput", "fluidity")
EXAMPLE = "see examples/slo.toml and docs/reports-and-audit.md"


@dataclass(frozen=True)
class StatLimit:
    """An upper limit on one run-level statistic, e.g. ``ttft_ms.p99 <= 2000``."""

    metric: str
    stat: str
    limit: float

    @property
    def name(self) -> str:
        return f"{self.metric}.{self.stat}"


@dataclass(frozen=True)
class GoodputSpec:
    """Per-request limits (ms) and the minima the run must reach."""

    limits: dict[str, float]
    min_attainment: float | None = None
    min_request_goodput_rps: float | None = None
    min_token_goodput_tps: float | None = None


@dataclass(frozen=True)
class FluiditySpec:
    """Etalon deadlines (ms) and lower limits on statistics of the per-request index."""

    ttft_deadline_ms: float
    tbt_deadline_ms: float
    minima: dict[str, float] = field(default_factory=dict)  # stat ("p01", "mean", "min", "service") -> limit


@dataclass(frozen=True)
class SloSpec:
    """Everything an SLO file asks for."""

    path: str
    limits: tuple[StatLimit, ...] = ()
    goodput: GoodputSpec | None = None
    fluidity: FluiditySpec | None = None

    @property
    def empty(self) -> bool:
        return not self.limits and self.goodput is None and self.fluidity is None

    @property
    def checks_nothing(self) -> bool:
        """No limit to hold: a [goodput] section without minima only measures (replay, nightly)."""
        g = self.goodput
        minima = g is not None and any(
            m is not None for m in (g.min_attainment, g.min_request_goodput_rps, g.min_token_goodput_tps)
        )
        return not self.limits and not minima and not (self.fluidity and self.fluidity.minima)

    def require_checks(self) -> None:
        """Refuse a file that would pass any run (``audit``, ``fleet --slo``): "PASS (0 checks)" misleads."""
        if self.checks_nothing:
            raise InputError(
                f"{self.path}: sets no limit to check: its [goodput] section has per-request limits but no "
                "minimum; add min_attainment (e.g. 0.99), min_request_goodput_rps or min_token_goodput_tps, "
                f"or [slo] limits; {EXAMPLE}"
            )


def _bad(path: str, where: str, what: str) -> InputError:
    return InputError(f"{path}: {where}: {what}; {EXAMPLE}")


def _number(path: str, where: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(path, where, f"expected a number, got {value!r}")
    try:
        x = float(value)
    except OverflowError:  # a TOML integer has no bound; a limit beyond a double's range is no limit
        text = str(value)
        raise _bad(
            path, where, f"expected a finite number, got an integer of {len(text)} digits ({text[:12]}...)"
        ) from None
    if x != x or x in (float("inf"), float("-inf")):
        raise _bad(path, where, f"expected a finite number, got {value!r}")
    return x


def _toml_key(parts: tuple[str, ...]) -> str:
    """How a key was written: ``ttft_ms.p99`` (dotted) or ``"ttft_ms.p99"`` (one quoted key)."""
    bare = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"
    return ".".join(p if p and all(c in bare for c in p) else json.dumps(p, ensure_ascii=False) for p in parts)


def _flatten(path: str, section: str, table: dict, parts: tuple[str, ...] = ()) -> dict[str, tuple[str, object]]:
    """``{"ttft_ms": {"p99": 1}}`` and ``{"ttft_ms.p99": 1}`` both give ``{"ttft_ms.p99": ("ttft_ms.p99", 1)}``
    (name -> (the key as written, value)); a name reached both ways is an error, not the later one winning."""
    out: dict[str, tuple[str, object]] = {}
    for key, value in table.items():
        here = (*parts, key)
        items = (
            _flatten(path, section, value, here).items()
            if isinstance(value, dict)
            else [(".".join(here), (_toml_key(here), value))]
        )
        for name, (written, v) in items:
            if name in out:
                raise _bad(
                    path,
                    f"{section} {name}",
                    f"written twice ({out[name][0]} = {out[name][1]!r} and {written} = {v!r} name the same SLO); "
                    "keep one of them",
                )
            out[name] = (written, v)
    return out


def _same_stat(stat: str) -> str:
    """One name per statistic: ``p1``, ``p01`` and ``p010`` are all the 1st percentile (``p01``);
    ``p0``, ``p00`` and a percentile that rounds to 0 at the 4 decimals a name keeps
    (``p00000001``, named ``p00``) are the smallest value, ``min``."""
    p = percentile_of(stat)
    if p == 0 or (p is not None and percentile_name(p) == percentile_name(0)):
        return "min"
    return percentile_name(p) if p is not None else stat


def _below_100(path: str, where: str, stat: str, instead: str) -> None:
    """Refuse a percentile that reads as 100 or rounds to it: ``p9999999999999999999`` is
    99.99999999999999999, the float 100.0, and a percentile keeps 4 decimals (``p99999999`` is
    named ``p100``), so either is the largest value under another name (``p100`` itself reads
    as 10.0, and :func:`percentile_of` refuses it)."""
    p = percentile_of(stat)
    if p is not None and (p >= 100 or percentile_name(p) == "p100"):
        raise _bad(
            path,
            where,
            f"{stat} reads as {p:.10g}"
            + (", 100 at the 4 decimals a percentile keeps" if p < 100 else "")
            + f": the 100th percentile is the largest value; a percentile must be below 100 (at most p999999 = "
            f"99.9999); {instead}",
        )


def _stat_limits(path: str, table: object) -> tuple[StatLimit, ...]:
    if not isinstance(table, dict):
        raise _bad(path, "[slo]", "must be a table of <metric>.<stat> = limit")
    limits = []
    seen: dict[tuple[str, str], str] = {}
    for key, (written, value) in _flatten(path, "[slo]", table).items():
        where = f"[slo] {key}"
        metric, _, stat = key.partition(".")
        if metric not in SLO_METRICS:
            raise _bad(path, where, f"unknown metric {metric!r}; known metrics: {', '.join(SLO_METRICS)}")
        if stat not in PLAIN_STATS and percentile_of(stat) is None:
            if stat.startswith("p100") and stat[1:].isdigit():  # p100 reads as p10.0: refused, but meant as the max
                raise _bad(path, where, f"{stat}: the 100th percentile is the largest value; write {metric}.max")
            raise _bad(
                path,
                where,
                f"unknown statistic {stat!r}; use p50, p90, p99, p999 (any pNN) or "
                f"{', '.join(PLAIN_STATS)}, as in {metric}.p99 = 2000",
            )
        _below_100(path, where, stat, f"write {metric}.max for the largest value")
        same = seen.setdefault((metric, _same_stat(stat)), written)
        if same != written:
            raise _bad(path, where, f"written twice ({same} and {written} are the same statistic); keep one of them")
        limit = _number(path, where, value)
        if stat == "std" and limit < 0:
            raise _bad(
                path,
                where,
                f"a standard deviation is >= 0 ms, got {limit:g}; give an upper limit >= 0, as in {metric}.std = 50",
            )
        if stat != "std" and limit <= 0:
            raise _bad(path, where, f"a limit in milliseconds must be > 0, got {limit:g}; as in {metric}.{stat} = 2000")
        limits.append(StatLimit(metric, stat, limit))
    return tuple(limits)


def _goodput(path: str, table: object) -> GoodputSpec:
    if not isinstance(table, dict):
        raise _bad(path, "[goodput]", "must be a table of per-request limits")
    limits: dict[str, float] = {}
    minima: dict[str, float] = {}
    for key, value in table.items():
        where = f"[goodput] {key}"
        if key in GOODPUT_METRICS:
            limits[key] = _number(path, where, value)
            if limits[key] <= 0:
                raise _bad(path, where, f"a per-request limit in milliseconds must be > 0, got {limits[key]:g}")
        elif key in GOODPUT_MINIMA:
            minima[key] = _number(path, where, value)
            if key != "min_attainment" and minima[key] < 0:
                unit = "requests/s" if key == "min_request_goodput_rps" else "output tokens/s"
                raise _bad(path, where, f"a rate is >= 0 ({unit}), got {minima[key]:g}")
        else:
            raise _bad(
                path,
                where,
                f"unknown key; per-request limits: {', '.join(GOODPUT_METRICS)}; minima: {', '.join(GOODPUT_MINIMA)}",
            )
    if not limits:
        raise _bad(path, "[goodput]", f"needs at least one per-request limit ({', '.join(GOODPUT_METRICS)})")
    att = minima.get("min_attainment")
    if att is not None and not 0 <= att <= 1:
        raise _bad(path, "[goodput] min_attainment", f"is a fraction between 0 and 1 (0.99 = 99%), got {att}")
    return GoodputSpec(limits, **minima)


def _fluidity(path: str, table: object) -> FluiditySpec:
    if not isinstance(table, dict):
        raise _bad(path, "[fluidity]", "must be a table")
    deadlines = {}
    for key in ("ttft_deadline_ms", "tbt_deadline_ms"):
        if key not in table:
            raise _bad(path, "[fluidity]", f"missing {key}")
        deadlines[key] = _number(path, f"[fluidity] {key}", table[key])
        if deadlines[key] <= 0:
            raise _bad(path, f"[fluidity] {key}", "must be > 0")
    minima: dict[str, float] = {}
    seen: dict[str, str] = {}
    for key, value in table.items():
        if key in deadlines:
            continue
        where = f"[fluidity] {key}"
        stat = key.removeprefix("min_index_")
        if not key.startswith("min_index_") or (stat not in ("mean", "min", "service") and percentile_of(stat) is None):
            raise _bad(
                path,
                where,
                "unknown key; use ttft_deadline_ms, tbt_deadline_ms and lower limits "
                "min_index_p01 (any pNN), min_index_mean, min_index_min, min_index_service",
            )
        _below_100(path, where, stat, "as in min_index_p99")
        same = seen.setdefault(_same_stat(stat), key)
        if same != key:
            raise _bad(path, where, f"written twice ({same} and {key} are the same statistic); keep one of them")
        minima[stat] = _number(path, where, value)
        if not 0 <= minima[stat] <= 1:
            raise _bad(path, where, f"the fluidity index is a fraction between 0 and 1, got {minima[stat]}")
    if not minima:
        raise _bad(
            path,
            "[fluidity]",
            "has deadlines but no lower limit on the index, so nothing would be checked; add one, "
            "e.g. min_index_p01 = 0.9 (or min_index_mean, min_index_min, min_index_service)",
        )
    return FluiditySpec(deadlines["ttft_deadline_ms"], deadlines["tbt_deadline_ms"], minima)


def parse_slo(data: dict, path: str = "<slo>") -> SloSpec:
    """An :class:`SloSpec` from parsed TOML (``path`` only names it in errors)."""
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise _bad(path, f"[{unknown[0]}]", f"unknown section; known sections: {', '.join(SECTIONS)}")
    spec = SloSpec(
        path=path,
        limits=_stat_limits(path, data["slo"]) if "slo" in data else (),
        goodput=_goodput(path, data["goodput"]) if "goodput" in data else None,
        fluidity=_fluidity(path, data["fluidity"]) if "fluidity" in data else None,
    )
    if spec.empty:
        raise InputError(f"{path}: holds no SLOs; add [slo], [goodput] or [fluidity] ({EXAMPLE})")
    return spec


def load_slo(path: str | Path) -> SloSpec:
    """Read and validate an SLO file."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"SLO file {p} does not exist or is not a file; {EXAMPLE}")
    try:
        # utf-8-sig: editors on Windows save a byte order mark, which TOML itself does not allow
        data = tomllib.loads(p.read_text(encoding="utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise InputError(f"{p}: not UTF-8 text ({exc}); save the SLO file as UTF-8") from exc
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{p}: invalid TOML: {exc}; {EXAMPLE}") from exc
    return parse_slo(data, str(p))


def goodput(con: duckdb.DuckDBPyConnection, run_id: str, spec: GoodputSpec, duration_s: float | None) -> dict[str, Any]:
    """DistServe / vLLM goodput of one run's requests under per-request limits: the one implementation.

    It reads a relation named ``request_latency`` (the derived table, or a replay's
    requests put through ``queries/request_latency.sql``) for ``run_id``; all of its rows
    are the population. A request is *good* when its status is ``ok`` and it meets every
    limit (up to :data:`TIE_MS`); ``tpot_ms`` is undefined for a single-token request, which therefore meets a
    TPOT limit (vLLM counts its TPOT as 0); a missing value (no first token, no finish)
    does not meet its limit. ``attainment = good / all requests`` (failed ones count as
    not good), ``request_goodput_rps = good / duration_s``,
    ``token_goodput_tps = output tokens of good requests / duration_s``; each is None when
    the run has no requests or no duration, or when no ok request of the run has a value of
    some limited metric (``unmeasured`` names it: a client without steps has no ``queue_ms``):
    an SLO on it cannot be evaluated, rather than every request failing it.
    """
    params: dict[str, Any] = {"run_id": run_id, "tie_ms": TIE_MS}
    meets, has = [], []
    for metric, limit in spec.limits.items():
        if metric not in GOODPUT_METRICS:  # names reach the SQL text only from the registry
            raise InputError(f"goodput: unknown per-request metric {metric!r}; use {', '.join(GOODPUT_METRICS)}")
        params[f"lim_{metric}"] = limit
        single_token = " or (tpot_ms is null and output_tokens <= 1)" if metric == "tpot_ms" else ""
        meets.append(f"coalesce({metric} <= $lim_{metric} + $tie_ms{single_token}, false) as meets_{metric}")
        has.append(f"({metric} is not null{single_token}) as has_{metric}")
    all_met = " and ".join(f"meets_{m}" for m in spec.limits)
    sql = f"""
        with judged as (
            select status, output_tokens, {", ".join(meets)}, {", ".join(has)}
            from request_latency where run_id = $run_id
        )
        select
            count(*),
            count(*) filter (where status = 'ok'),
            count(*) filter (where status = 'ok' and {all_met}),
            coalesce(sum(output_tokens) filter (where status = 'ok' and {all_met}), 0),
            {", ".join(f"count(*) filter (where status = 'ok' and meets_{m})" for m in spec.limits)},
            {", ".join(f"count(*) filter (where status = 'ok' and coalesce(has_{m}, false))" for m in spec.limits)}
        from judged
    """
    total, ok, good, good_tokens, *counts = con.execute(sql, params).fetchall()[0]
    per_limit, with_value = counts[: len(spec.limits)], counts[len(spec.limits) :]
    unmeasured = [m for m, n in zip(spec.limits, with_value) if ok and not n]
    dur = duration_s if duration_s is not None and duration_s > 0 else None  # NaN > 0 is False too
    # no requests recorded (a steps-only log) says nothing of goodput: not 0 req/s, no value
    measured = bool(total) and not unmeasured
    rate = (lambda x: x / dur) if dur and measured else (lambda x: None)
    return {
        "limits_ms": dict(spec.limits),
        "requests": total,
        "requests_ok": ok,
        "good_requests": good,
        "good_output_tokens": int(good_tokens),
        "attainment": good / total if measured else None,
        "attainment_by_limit": {
            m: (n / total if total and m not in unmeasured else None) for m, n in zip(spec.limits, per_limit)
        },
        "unmeasured": unmeasured,
        "duration_s": duration_s,
        "request_goodput_rps": rate(good),
        "token_goodput_tps": rate(good_tokens),
    }
