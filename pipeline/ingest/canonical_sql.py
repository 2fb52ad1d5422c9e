"""SQL that validates canonical records (SPEC §2) line by line, inside DuckDB.

The field lists below are the single description of the canonical format: the SQL
that extracts typed columns, names every problem of a line, and keeps unknown
fields in ``extra`` is generated from them.  Only our own constant names are
placed in the SQL text; values from files are always data.
"""

from __future__ import annotations

from dataclasses import dataclass

NUMERIC = "('UBIGINT','BIGINT','DOUBLE')"

# Finite is not enough: 1.797e308 - 10 overflows to an infinite duration, and later
# sums and statistics fail or mislead. Values beyond these are no plausible trace.
MAX_ABS_TIME_S = 1e11  # Unix time of the year 5138; more is not seconds (ms or ns stamps, garbage)
MAX_DURATION_S = 1e7  # 116 days: longer than any serving run
MAX_COUNT = 2**53  # JSON numbers are doubles: integers beyond this are not exact


def _sci(x: float) -> str:
    mantissa, exponent = f"{x:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"  # 1e11, as a person writes it


@dataclass(frozen=True)
class Field:
    name: str
    kind: str  # int | count | float | fraction | str | id | strlist | floatlist | object | status | clock
    required: bool = False
    sql_type: str = ""

    @property
    def column_type(self) -> str:
        return {
            "int": "bigint",
            "count": "bigint",
            "float": "double",
            "fraction": "double",
            "strlist": "varchar[]",
            "floatlist": "double[]",
            "object": "json",
        }.get(self.kind, "varchar")


RUN_FIELDS = (
    Field("run_id", "id"),
    Field("engine", "str"),
    Field("engine_version", "str"),
    Field("model", "str"),
    Field("gpu", "str"),
    Field("num_gpus", "count"),
    Field("dtype", "str"),
    Field("kv_dtype", "str"),
    Field("clock", "clock"),
    Field("meta", "object"),
)
ITERATION_FIELDS = (
    Field("iter", "int", required=True),
    Field("t_start", "float"),
    Field("t_end", "float"),
    Field("dur_ms", "float"),
    Field("prefill_tokens", "count"),
    Field("prefill_reqs", "count"),
    Field("decode_tokens", "count"),
    Field("decode_reqs", "count"),
    Field("context_tokens", "count"),
    Field("running_reqs", "count"),
    Field("waiting_reqs", "count"),
    Field("kv_usage", "fraction"),
    Field("preempted_reqs", "count"),
    Field("req_ids", "strlist"),
)
REQUEST_FIELDS = (
    Field("req_id", "id", required=True),
    Field("t_arrival", "float", required=True),
    Field("t_scheduled", "float"),
    Field("t_first_token", "float"),
    Field("t_finish", "float"),
    Field("prompt_tokens", "count"),
    Field("output_tokens", "count"),
    Field("cached_tokens", "count"),
    Field("preemptions", "count"),
    Field("status", "status"),
    Field("token_times", "floatlist"),
)
FIELDS = {"run": RUN_FIELDS, "iteration": ITERATION_FIELDS, "request": REQUEST_FIELDS}
COMMON = ("kind", "run_id")


_TYPED = {
    "int": "DOUBLE", "count": "DOUBLE", "float": "DOUBLE", "fraction": "DOUBLE", "str": "VARCHAR",
    "id": "VARCHAR", "status": "VARCHAR", "clock": "VARCHAR", "strlist": "VARCHAR[]", "floatlist": "DOUBLE[]",
    "object": "JSON",
}


def _typed_spec(fields: tuple[Field, ...]) -> str:
    return "{" + ",".join(f'"{f.name}":"{_TYPED[f.kind]}"' for f in fields) + "}"


def _paths(fields: tuple[Field, ...]) -> str:
    return "[" + ",".join(f"'$.{f.name}'" for f in fields) + "]"


# Each record is parsed twice: once for the JSON type of every field (``ty``) and
# once into a typed struct (``v``).  The typed parse alone is lenient ("5" becomes
# 5.0), so a value is taken only where its JSON type is the right one.
def _value(f: Field, i: int) -> str:
    """Typed value of a field, NULL when absent, null or of the wrong type."""
    v, t = f"v.{f.name}", f"ty[{i}]"
    if f.kind in ("int", "count"):
        return (
            f"case when {t} in ('UBIGINT','BIGINT','DOUBLE') and {v} = round({v}) and abs({v}) < 9e18 "
            f"then {v}::bigint end"
        )
    if f.kind in ("float", "fraction"):
        return f"case when {t} in {NUMERIC} then {v} end"
    if f.kind == "id":
        return f"case when {t} in ('VARCHAR','UBIGINT','BIGINT') then {v} end"
    if f.kind in ("str", "status", "clock"):
        return f"case when {t} = 'VARCHAR' then {v} end"
    if f.kind in ("strlist", "floatlist"):
        return f"case when {t} = 'ARRAY' then {v} end"
    if f.kind == "object":
        return f"case when {t} = 'OBJECT' then {v} end"
    raise ValueError(f.kind)


_EXPECT = {
    "int": "an integer",
    "count": "a non-negative integer",
    "float": "a number",
    "fraction": "a number between 0 and 1",
    "str": "a string",
    "id": "a string or integer",
    "status": "one of ok, error, aborted",
    "clock": "unix or monotonic",
    "strlist": "a list of strings",
    "floatlist": "a list of numbers",
    "object": "an object",
}


def _problem(f: Field, i: int) -> str:
    """A SQL expression naming what is wrong with one field, or NULL."""
    t, val = f"ty[{i}]", f"v_{f.name}"
    shown = f"left(json_extract(raw, '$.{f.name}')::varchar, 40)"
    absent = f"({t} is null or {t} = 'NULL')"
    checks = [f"when not {absent} and {val} is null then '{f.name}: expected {_EXPECT[f.kind]}, got ' || {shown}"]
    if f.required:
        checks.insert(0, f"when {absent} then 'missing required field {f.name}'")
    if f.kind in ("float", "fraction"):
        checks.append(f"when isnan({val}) or isinf({val}) then '{f.name}: NaN or infinite value ' || {shown}")
    if f.kind == "count":
        checks.append(f"when {val} < 0 then '{f.name}: negative count ' || {shown}")
    if f.kind in ("int", "count"):
        checks.append(f"when abs({val}) > {MAX_COUNT} then '{f.name}: implausibly large (over 2^53) ' || {shown}")
    if f.kind == "float" and f.name.startswith("t_"):
        checks.append(f"when abs({val}) > {_sci(MAX_ABS_TIME_S)} then '{f.name}: ' || {shown} || "
                      f"' is no time in seconds (magnitude over {_sci(MAX_ABS_TIME_S)}; milli- or nanoseconds?)'")
    if f.name == "dur_ms":
        checks.append(f"when {val} > {_sci(MAX_DURATION_S * 1000)} then '{f.name}: ' || {shown} || "
                      f"' ms is longer than {_sci(MAX_DURATION_S)} s'")
    if f.kind == "fraction":
        checks.append(f"when {val} < 0 or {val} > 1 then '{f.name}: expected a fraction 0..1, got ' || {shown}")
    if f.kind == "status":
        checks.append(f"when {val} not in ('ok','error','aborted') then '{f.name}: expected {_EXPECT[f.kind]}, got ' || {shown}")
    if f.kind == "clock":
        checks.append(f"when {val} not in ('unix','monotonic') then '{f.name}: expected {_EXPECT[f.kind]}, got ' || {shown}")
    if f.kind == "floatlist":
        checks.append(
            # a NaN or infinity anywhere makes the sum non-finite; nulls are not counted
            f"when list_count({val}) <> len({val}) or isnan(list_sum({val})) or isinf(list_sum({val})) "
            f"then '{f.name}: contains null, NaN or infinite values'"
        )
        big = _sci(MAX_ABS_TIME_S)
        checks.append(f"when list_max(list_transform({val}, lambda x: abs(x))) > {big} "
                      f"then '{f.name}: holds values that are no time in seconds (magnitude over {big})'")
    return "case " + " ".join(checks) + " end"


# Checks that involve several fields, per kind; evaluated on typed values.
CROSS_CHECKS = {
    "iteration": (
        # a step known only by one time point (e.g. SGLang prefill lines) is kept, duration NULL
        "case when v_t_start is null and v_t_end is null and v_dur_ms is null "
        "then 'needs t_start, t_end or dur_ms' end",
        "case when v_t_end < v_t_start then 't_end (' || v_t_end || ') is before t_start (' || v_t_start || ')' end",
        "case when v_dur_ms < 0 then 'dur_ms is negative (' || v_dur_ms || ')' end",
        f"case when v_t_end - v_t_start > {_sci(MAX_DURATION_S)} "
        f"then 't_end - t_start (' || (v_t_end - v_t_start) || ' s) is longer than {_sci(MAX_DURATION_S)} s' end",
        # both given: they must agree (to float precision of epoch-second stamps)
        "case when abs((v_t_end - v_t_start) * 1000 - v_dur_ms) > 0.002 + 1e-6 * abs(v_dur_ms) "
        "then 'dur_ms (' || v_dur_ms || ') disagrees with (t_end - t_start) * 1000 ('"
        " || round((v_t_end - v_t_start) * 1000, 6) || ')' end",
    ),
    "request": (
        "case when v_t_scheduled < v_t_arrival then 't_scheduled is before t_arrival' end",
        "case when v_t_first_token < v_t_arrival then 't_first_token is before t_arrival' end",
        "case when v_t_first_token < v_t_scheduled then 't_first_token is before t_scheduled' end",
        "case when v_t_finish < coalesce(v_t_first_token, v_t_arrival) "
        "then 't_finish is before ' || case when v_t_first_token is null then 't_arrival' else 't_first_token' end end",
        "case when list_bool_or(list_transform(range(1, len(v_token_times)), "
        "lambda i: v_token_times[i + 1] < v_token_times[i])) "
        "then 'token_times must be non-decreasing' end",
        "case when len(v_token_times) > 0 and v_token_times[1] < v_t_arrival then 'token_times start before t_arrival' end",
        f"case when greatest(v_t_scheduled, v_t_first_token, v_t_finish, v_token_times[-1]) - v_t_arrival "
        f"> {_sci(MAX_DURATION_S)} then 'the request lasts longer than {_sci(MAX_DURATION_S)} s after t_arrival' end",
        "case when coalesce(v_status, 'ok') = 'ok' and len(v_token_times) > 0 and v_output_tokens is not null "
        # fewer times than tokens is allowed: a streamed chunk may carry several tokens (vLLM bench)
        "and len(v_token_times) > v_output_tokens "
        "then 'token_times has ' || len(v_token_times) || ' entries but output_tokens is only ' || v_output_tokens end",
    ),
    "run": (),
}


def stage_sql(kind: str) -> str:
    """Select typed columns and a ``reason`` (NULL when valid) for records of ``kind``.

    Reads ``parsed`` (line_no, raw, perr, kind, run_id); ``raw`` is valid JSON when perr is NULL.
    """
    fields = FIELDS[kind]
    values = ",\n    ".join(f"{_value(f, i)} as v_{f.name}" for i, f in enumerate(fields, 1))
    problems = ", ".join(_problem(f, i) for i, f in enumerate(fields, 1))
    cross = ", ".join(CROSS_CHECKS[kind])
    names = sorted({f.name for f in fields} | set(COMMON))
    known = "{" + ",".join(f'"{n}":null' for n in names) + "}"
    known_list = "[" + ",".join(f"'{n}'" for n in names) + "]"
    all_checks = problems + (", " + cross if cross else "")
    return f"""
with typed as (
  select line_no, raw, run_id, ty,
    -- unknown fields are kept; most records have none, so skip the patch for them
    case when len(list_filter(json_keys(raw), lambda k: not list_contains({known_list}, k))) > 0
      then nullif(json_merge_patch(raw, '{known}'), '{{}}') end as extra,
    {values}
  from (
    select *, json_type(raw, {_paths(fields)}) as ty, from_json(raw, '{_typed_spec(fields)}') as v
    from parsed where kind = '{kind}' and perr is null
  )
)
select * exclude (ty),
  nullif(array_to_string(list_filter([{all_checks}], lambda x: x is not null), '; '), '') as reason
from typed
"""
