"""SQL that validates canonical records (docs/canonical-format.md) line by line, inside DuckDB.

The field lists below are the single description of the canonical format: the SQL
that extracts typed columns, names every problem of a line, and keeps unknown
fields in ``extra`` is generated from them.  Only our own constant names are
placed in the SQL text; values from files are always data.
"""

from __future__ import annotations

import re

from dataclasses import dataclass

from .reader import JSON_SPACE

# A field's JSON type, as a small integer code: the checks compare every field's type
# several times, and comparing integers costs less than comparing the type names that
# json_type returns (names it might add later get the last code: no check accepts it).
JSON_TYPES = ("NULL", "VARCHAR", "OBJECT", "ARRAY", "BOOLEAN", "BIGINT", "UBIGINT", "DOUBLE", "OTHER")


def jt(name: str) -> str:
    """The SQL literal of the code of JSON type ``name``."""
    return f"{JSON_TYPES.index(name)}::utinyint"


NUMERIC = f"({jt('UBIGINT')},{jt('BIGINT')},{jt('DOUBLE')})"


def code_of(name: str) -> str:
    """The code of the json_type name ``name`` (an SQL expression); NULL when ``name`` is NULL.

    An absent field (no name) stays NULL: were it OTHER, a missing required field of a line
    that takes the slow path would not be named, and the line kept.
    """
    whens = " ".join(f"when '{n}' then {jt(n)}" for n in JSON_TYPES[:-1])
    return f"case when {name} is not null then case {name} {whens} else {jt('OTHER')} end end"


_CODE_OF = "lambda n: " + code_of("n")

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
# the names a record of each kind may hold; any other is an unknown field (kept in extra)
OWN_NAMES = {kind: frozenset({f.name for f in fields} | set(COMMON)) for kind, fields in FIELDS.items()}


# Every line is parsed ONCE, into a struct of all canonical fields (``PARSE_SPEC``),
# typed as the store wants them, except strings (and objects), which come back as
# their JSON text so that their JSON type is known.  The typed parse is lenient
# ("5" becomes 5.0, true 1.0): a value is taken only where its JSON type is the right
# one.  Knowing those types needs a second look at the line, which only few lines
# get: a line is *clean* when its double quotes are exactly those of the keys and
# string values the parse found (each unknown key, string where a number belongs,
# null or wrongly typed value, or escaped quote adds some; only booleans and lists
# of strings could take some away, and lines with those are not clean either).  A
# clean line has no unknown field, no field of another kind of record (the parse reads
# every kind's fields, so that is checked apart: such a field belongs in extra), and
# every field's JSON type follows from its parsed value; any other line is looked at
# again (json_type, json_keys) to say exactly what is wrong or what extra fields it has.
ALL_FIELDS: dict[str, Field] = {}
for _fields in FIELDS.values():
    for _f in _fields:
        ALL_FIELDS.setdefault(_f.name, _f)
_PARSED_TYPE = {
    "int": "DOUBLE",
    "count": "DOUBLE",
    "float": "DOUBLE",
    "fraction": "DOUBLE",
    "strlist": "VARCHAR[]",
    "floatlist": "DOUBLE[]",
}  # else JSON text


def _parse_spec(fields: dict[str, Field]) -> str:
    """from_json's structure for ``kind`` and ``fields``: typed, or JSON text (strings, objects)."""
    named = {"kind": Field("kind", "str"), **fields}
    return "{" + ",".join(f'"{n}":"{_PARSED_TYPE.get(f.kind, "JSON")}"' for n, f in named.items()) + "}"


PARSE_SPEC = _parse_spec(ALL_FIELDS)
_CLEAN_TYPE = {"strlist": "ARRAY", "floatlist": "ARRAY"}  # else DOUBLE


def _jtype(x: str, ints: bool = False) -> str:
    """JSON type name (as json_type says it) of the JSON text ``x`` (NULL when absent or null).

    ``ints``: tell integers (BIGINT) from other numbers (DOUBLE); only ids need that.
    """
    number = (
        f"case when regexp_full_match({x}, '-?[0-9]+') then {jt('BIGINT')} else {jt('DOUBLE')} end"
        if ints
        else jt("DOUBLE")
    )
    # the first character says it: " { [ t f, else a number (NaN and Infinity included)
    return (
        f"case when {x} is not null then case ascii({x}) when 34 then {jt('VARCHAR')} when 123 then {jt('OBJECT')} "
        f"when 91 then {jt('ARRAY')} when 116 then {jt('BOOLEAN')} when 102 then {jt('BOOLEAN')} else {number} end end"
    )


def _unquote(x: str) -> str:
    """The string value of the JSON string text ``x``."""
    return f"case when contains({x}, '\\') then json_extract_string({x}, '$') else {x}[2:-2] end"


# the run a record names for itself: only a valid run_id; a record whose run_id is rejected
# (a list, 1.5, "") must not carry the lines that follow it into a run named by that text
OWN_RUN_SQL = "case when trim(v_run_id) <> '' then v_run_id end"


def _x(name: str) -> str:
    """The parsed field: typed, or its JSON text (strings, objects); NULL when absent or null."""
    return f"x_{name}"


def _type(f: Field, looked_at: list[str]) -> str:
    """The JSON type of a field (NULL when absent); ``looked_at``: the typed fields, in the order of ``ty``."""
    x = _x(f.name)
    if f.kind in _PARSED_TYPE:
        i = looked_at.index(f.name) + 1
        return f"case when clean then case when {x} is not null then {jt(_CLEAN_TYPE.get(f.kind, 'DOUBLE'))} end else ty[{i}] end"
    return _jtype(x, ints=f.kind == "id")


def _typed(f: Field, t: str) -> str:
    """Lenient typed value of a field, given its JSON type ``t``."""
    x = _x(f.name)
    if f.kind in ("str", "status", "clock", "id"):
        return f"case when {t} = {jt('VARCHAR')} then {_unquote(x)} else {x} end"
    if f.kind == "object":
        return f"{x}::json"
    return x


def _value(f: Field, t: str, v: str) -> str:
    """Typed value of a field, NULL when absent, null or of the wrong type."""
    if f.kind in ("int", "count"):
        # isfinite first: DuckDB may decide abs(v) < 9e18 from a Parquet column's min and max,
        # which leave NaN out, and then cast a NaN
        return f"case when {t} in {NUMERIC} and isfinite({v}) and {v} = round({v}) and abs({v}) < 9e18 then {v}::bigint end"
    if f.kind in ("float", "fraction"):
        return f"case when {t} in {NUMERIC} then {v} end"
    if f.kind == "id":
        return f"case when {t} in ({jt('VARCHAR')},{jt('UBIGINT')},{jt('BIGINT')}) then {v} end"
    if f.kind in ("str", "status", "clock"):
        return f"case when {t} = {jt('VARCHAR')} then {v} end"
    if f.kind in ("strlist", "floatlist"):
        return f"case when {t} = {jt('ARRAY')} then {v} end"
    if f.kind == "object":
        return f"case when {t} = {jt('OBJECT')} then {v} end"
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


def _problem(f: Field, shown: str | None = None, label: str | None = None) -> list[tuple[str, str]]:
    """What can be wrong with one field: ``(condition, reason)`` pairs in SQL, the first true one wins.

    ``shown``: the expression that shows the value in a reason (default: its JSON text).
    ``label``: how a reason names the field (default: its name); an engine converter passes
    the source field the value came from, so the user finds it in their file.
    """
    name = f.name if label is None else label
    t, val = f"t_{f.name}", f"v_{f.name}"
    if shown is None:
        shown = (
            f"left(json_extract(jraw, '$.{f.name}')::varchar, 40)"
            if f.kind in _PARSED_TYPE
            else f"left({_x(f.name)}, 40)"
        )
    absent = f"({t} is null or {t} = {jt('NULL')})"
    checks = [(f"not {absent} and {val} is null", f"'{name}: expected {_EXPECT[f.kind]}, got ' || {shown}")]
    if f.required:
        checks.insert(0, (absent, f"'missing required field {name}'"))
    if f.kind in ("float", "fraction"):
        checks.append((f"isnan({val}) or isinf({val})", f"'{name}: NaN or infinite value ' || {shown}"))
    if f.kind == "id":
        # an empty id names nothing: requests would collide under it, lines would go to a nameless run
        checks.append((f"trim({val}) = ''", f"'{name}: empty; leave the field out instead'"))
    if f.kind == "count":
        checks.append((f"{val} < 0", f"'{name}: negative count ' || {shown}"))
    if f.kind in ("int", "count"):
        checks.append((f"abs({val}) > {MAX_COUNT}", f"'{name}: implausibly large (over 2^53) ' || {shown}"))
    if f.kind == "float" and f.name.startswith("t_"):
        checks.append(
            (
                f"abs({val}) > {_sci(MAX_ABS_TIME_S)}",
                f"'{name}: ' || {shown} || "
                f"' is no time in seconds (magnitude over {_sci(MAX_ABS_TIME_S)}; milli- or nanoseconds?)'",
            )
        )
    if f.name == "dur_ms":
        checks.append(
            (
                f"{val} > {_sci(MAX_DURATION_S * 1000)}",
                f"'{name}: ' || {shown} || ' ms is longer than {_sci(MAX_DURATION_S)} s'",
            )
        )
    if f.kind == "fraction":
        checks.append((f"{val} < 0 or {val} > 1", f"'{name}: expected a fraction 0..1, got ' || {shown}"))
    if f.kind == "status":
        checks.append(
            (f"{val} not in ('ok','error','aborted')", f"'{name}: expected {_EXPECT[f.kind]}, got ' || {shown}")
        )
    if f.kind == "clock":
        checks.append((f"{val} not in ('unix','monotonic')", f"'{name}: expected {_EXPECT[f.kind]}, got ' || {shown}"))
    if f.kind == "floatlist":
        checks.append((_list_not_finite(val), f"'{name}: contains null, NaN or infinite values'"))
        big = _sci(MAX_ABS_TIME_S)
        checks.append(
            (_list_too_big(val), f"'{name}: holds values that are no time in seconds (magnitude over {big})'")
        )
    return checks


def _list_not_finite(v: str) -> str:
    # a NaN or infinity anywhere makes the sum non-finite; nulls are not counted
    return f"list_count({v}) <> len({v}) or isnan(list_sum({v})) or isinf(list_sum({v}))"


def _list_too_big(v: str) -> str:
    return f"list_max(list_transform({v}, lambda x: abs(x))) > {_sci(MAX_ABS_TIME_S)}"


def _list_decreasing(v: str) -> str:
    # each time against the one before it (pairs of the list and itself shifted by one)
    return f"list_bool_or(list_transform(list_zip({v}[2:], {v}[:-2]), lambda p: p[1] < p[2]))"


def _list_gate(v: str) -> str:
    """True exactly when one of _list_not_finite, _list_too_big, _list_decreasing is, at the cost
    of the last alone (the other two pass over every element as well).

    A list that is not decreasing anywhere is in order, and DuckDB orders NaN above every
    number: its NaN and +inf can only be last, its -inf first, and its largest magnitude is
    at one end. So it holds no NaN, infinity or magnitude over the bound iff its two ends do
    not; nulls (skipped by the pairwise test) are counted apart.
    """
    big = _sci(MAX_ABS_TIME_S)
    return (
        f"{_list_decreasing(v)} or list_count({v}) <> len({v}) or not (abs({v}[1]) <= {big} and abs({v}[-1]) <= {big})"
    )


UNWORDED = "a check failed without a message for it (a tracelat bug: please report this line)"


def reasons_sql(groups: list[list[tuple[str, str]]], gates: dict[frozenset[str], str] | None = None) -> str:
    """Every problem of a record, joined by '; ', or NULL: one reason per group (its first true condition).

    Nearly every record has none: one OR of all conditions decides that, and only the
    records for which it holds build their reasons (one CASE per group, then concat_ws),
    which cost more than the rest of the validation when done for every record.
    ``gates``: in that OR, a set of conditions may stand replaced by one cheaper condition
    that is true exactly when one of them is.
    """
    conds = [c for g in groups for c, _ in g]
    for replaced, gate in (gates or {}).items():
        assert replaced <= set(conds), replaced
        conds = [c for c in conds if c not in replaced] + [gate]
    any_true = " or ".join(f"({c})" for c in conds)
    parts = ", ".join("case " + " ".join(f"when {c} then {m}" for c, m in g) + " end" for g in groups)
    # a failed check whose message came out NULL (a NULL in its text) still rejects the record
    return f"case when {any_true} then coalesce(nullif(concat_ws('; ', {parts}), ''), '{UNWORDED}') end"


def kind_reasons_sql(kind: str, shown: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> str:
    """Every problem of a record of ``kind`` (its fields' checks, then the cross-field ones), or NULL.

    ``labels``: how reasons name some fields (see :func:`_problem`)."""
    labels = labels or {}
    # every record may name its run; a bad name is the record's problem whatever its kind
    own = FIELDS[kind] if kind == "run" else (RUN_FIELDS[0], *FIELDS[kind])
    fields = [_problem(f, None if shown is None else shown[f.name], labels.get(f.name)) for f in own]
    cross = [c for c, _ in CROSS_CHECKS[kind]]
    gates = {
        frozenset({_list_not_finite(v), _list_too_big(v), _list_decreasing(v)}): _list_gate(v)
        for v in (f"v_{f.name}" for f in FIELDS[kind] if f.kind == "floatlist")
        if _list_decreasing(v) in cross
    }
    gated = {c for g in gates for c in g}
    floats = [f"v_{f.name}" for f in FIELDS[kind] if f.kind == "float"]
    checks = []
    for c, m in CROSS_CHECKS[kind]:
        used = [v for v in floats if re.search(rf"\b{v}\b", c)]
        if used and c not in gated:
            # a NaN or infinite time is its field's reject already; compared with the others it
            # only adds false reasons ("lasts longer than 1e7 s"). The guard is needed in the
            # reasons alone: the record is rejected either way, so the cheap test keeps the bare check
            finite = " and ".join(f"isfinite(coalesce({v}, 0))" for v in used)
            guarded = f"{finite} and ({c})"
            gates[frozenset({guarded})] = c
            c = guarded
        checks.append([(c, m)])
    return reasons_sql(fields + checks, gates)


# Checks that involve several fields, per kind: ``(condition, reason)`` on typed values.
CROSS_CHECKS = {
    "iteration": (
        # a step known only by one time point (e.g. SGLang prefill lines) is kept, duration NULL
        ("v_t_start is null and v_t_end is null and v_dur_ms is null", "'needs t_start, t_end or dur_ms'"),
        ("v_t_end < v_t_start", "'t_end (' || v_t_end || ') is before t_start (' || v_t_start || ')'"),
        ("v_dur_ms < 0", "'dur_ms is negative (' || v_dur_ms || ')'"),
        (
            f"v_t_end - v_t_start > {_sci(MAX_DURATION_S)}",
            f"'t_end - t_start (' || (v_t_end - v_t_start) || ' s) is longer than {_sci(MAX_DURATION_S)} s'",
        ),
        # both given: they must agree (to float precision of epoch-second stamps)
        (
            "abs((v_t_end - v_t_start) * 1000 - v_dur_ms) > 0.002 + 1e-6 * abs(v_dur_ms)",
            "'dur_ms (' || v_dur_ms || ') disagrees with (t_end - t_start) * 1000 ('"
            " || round((v_t_end - v_t_start) * 1000, 6) || ')'",
        ),
    ),
    "request": (
        ("v_t_scheduled < v_t_arrival", "'t_scheduled is before t_arrival'"),
        ("v_t_first_token < v_t_arrival", "'t_first_token is before t_arrival'"),
        ("v_t_first_token < v_t_scheduled", "'t_first_token is before t_scheduled'"),
        (
            "v_t_finish < coalesce(v_t_first_token, v_t_arrival)",
            "'t_finish is before ' || case when v_t_first_token is null then 't_arrival' else 't_first_token' end",
        ),
        (_list_decreasing("v_token_times"), "'token_times must be non-decreasing'"),
        ("len(v_token_times) > 0 and v_token_times[1] < v_t_arrival", "'token_times start before t_arrival'"),
        (
            f"greatest(v_t_scheduled, v_t_first_token, v_t_finish, v_token_times[-1]) - v_t_arrival "
            f"> {_sci(MAX_DURATION_S)}",
            f"'the request lasts longer than {_sci(MAX_DURATION_S)} s after t_arrival'",
        ),
        (
            "coalesce(v_status, 'ok') = 'ok' and len(v_token_times) > 0 and v_output_tokens is not null "
            # fewer times than tokens is allowed: a streamed chunk may carry several tokens (vLLM bench)
            "and len(v_token_times) > v_output_tokens",
            "'token_times has ' || len(v_token_times) || ' entries but output_tokens is only ' || v_output_tokens",
        ),
    ),
    "run": (),
}


BLANK = "blank"
PARSE_ERRORS = {
    "invalid": "not valid JSON (truncated or garbage line)",
    "not_object": "not a JSON object",
    "no_kind": "missing field kind (expected run, iteration or request)",
    "kind_type": "kind must be a string",
}


ALL_KINDS = tuple(FIELDS)
# the reason of a record whose (string) kind is none of ALL_KINDS
UNKNOWN_KIND = "'unknown kind ' || kind || ' (expected run, iteration or request)'"


def own_names_null(kind: str) -> str:
    """A JSON object of ``kind``'s own names, each null: merge-patched onto a record, it leaves
    the fields that are not the record's own (its ``extra``)."""
    return "{" + ",".join(f'"{n}":null' for n in sorted(OWN_NAMES[kind])) + "}"


def _quotes_if_clean(names: list[str], json_text: list[str], fields: dict[str, Field]) -> str:
    """The double quotes of a clean line whose parsed fields are ``names``: two for the kind's key
    and two for its value, two for each present field's key, two for each string value."""
    present = " + ".join(f"({_x(n)} is not null)::int" for n in names) or "0"
    strings = (
        " + ".join(
            f"coalesce(ascii({_x(n)}) = 34, false)::int" for n in names if n in json_text and fields[n].kind != "object"
        )
        or "0"
    )
    return f"2 * (1 + {present}) + 2 * (1 + {strings})"


def stage_sql(
    source: str,
    line_no: str | None = "line_no",
    keep_raw: bool = True,
    kinds: tuple[str, ...] = ALL_KINDS,
    file_quotes: bool = False,
) -> str:
    """Parse and validate every line of ``source`` (a relation with a ``raw`` column) in one pass.

    One row per line, in the order of ``source``: ``line_no`` (the expression given, or
    none when ``line_no`` is None), ``kind``, ``own_run`` (the record's own run_id),
    ``v_<field>`` typed values of every canonical field, ``extra`` (unknown fields),
    ``reason`` (every problem of the line, NULL when valid; ``'blank'`` for blank
    lines, which are skipped) and ``raw`` (cut to 1 KiB; with ``keep_raw=False`` only
    for lines rejected here).  Only our own constant names are placed in the SQL text.

    ``kinds``: the record kinds ``source`` may hold; a line of another (known) kind is
    rejected.  Fewer kinds make a smaller statement: binding the whole one costs about
    50 ms, which a file of a few lines feels (an engine converter's own run record).

    ``file_quotes``: leave the quote count out of the clean test and add a column ``quotes``:
    the quotes a line has if it is clean, else (lines that fail the rest of the test) the
    quotes it has.  A line has at least as many quotes as it would have clean, so the sum
    of ``quotes`` equals the file's count of double quotes exactly when every line that
    passed is clean: the caller compares the two and, if they differ, stages the file again
    without ``file_quotes``.  Counting quotes per line is a seventh of the staging of a big
    file; the whole file's count rides along its hash (``reader.sha256_and_quotes``).
    """
    wanted = frozenset().union(*(OWN_NAMES[k] for k in kinds))
    fields = {n: f for n, f in ALL_FIELDS.items() if n in wanted}
    json_text = [n for n, f in fields.items() if f.kind not in _PARSED_TYPE]
    looked_at = [n for n, f in fields.items() if f.kind in _PARSED_TYPE]  # typed: JSON type from json_type
    texts = ",\n          ".join(
        f"j.{n}{'::varchar' if n in json_text and f.kind != 'object' else ''} as {_x(n)}" for n, f in fields.items()
    )
    objects = " and ".join(f"{_x(n)} is null" for n, f in fields.items() if f.kind in ("object", "strlist")) or "true"
    # a field of another kind (t_arrival on a step) is parsed but is no field of this record:
    # the line is not clean, and the field goes to extra with the unknown ones. Counted file-wide,
    # such a field's key adds quotes that the clean count of its line leaves out (it counts the
    # kind's own fields only), so the sums differ and the file is staged again line by line:
    # the test per field (a fifth of the statement's validation CPU) is needed there only.
    own_fields_only = (
        f"{_x('kind')} in (" + ",".join(f"'\"{k}\"'" for k in kinds) + ")"
        if file_quotes
        else " or ".join(
            f"({_x('kind')} = '\"{k}\"'"
            + "".join(f" and {_x(n)} is null" for n in fields if n not in OWN_NAMES[k])
            + ")"
            for k in kinds
        )
    )
    quotes_of_line = "len(string_split(raw, '\"')) - 1"
    quotes_if_clean = _quotes_if_clean(list(fields), json_text, fields)
    clean = (
        f"perr is null and t_kind = {jt('VARCHAR')} and ({own_fields_only}) and {objects} "
        # file-wide, a null or an escaped quote (common: a request's "t_finish":null) must not make
        # the sums differ: such lines are not clean, and count the quotes they hold
        + ("and not contains(raw, 'null') and not contains(raw, '\\\"') " if file_quotes else "")
        + ("" if file_quotes else f"and {quotes_of_line} = {quotes_if_clean} ")
        + "and not contains(raw, 'true') and not contains(raw, 'false')"
    )
    # count a kind's own fields only (half the work): the clean test leaves fields of another kind
    # to the sums in this mode, and their keys' quotes must make them differ
    own_quotes = " ".join(
        f"when {_x('kind')} = '\"{k}\"' then "
        + _quotes_if_clean([n for n in fields if n in OWN_NAMES[k]], json_text, fields)
        for k in kinds
    )
    quotes_col = (
        f", case when clean then case {own_quotes} end else coalesce({quotes_of_line}, 0) end as quotes"
        if file_quotes
        else ""
    )
    # the kind's string: a known kind's JSON text maps to a constant (a substring per line cost
    # a tenth of the validation); any other is unquoted
    kind_of_text = (
        f"case {_x('kind')} "
        + " ".join(f"when '\"{k}\"' then '{k}'" for k in ALL_KINDS)
        + f" else case when t_kind = {jt('VARCHAR')} then {_unquote(_x('kind'))} else {_x('kind')} end end"
    )
    paths = "[" + ",".join(f"'$.{n}'" for n in looked_at) + "]"
    types = ",\n        ".join(f"{_type(f, looked_at)} as t_{n}" for n, f in fields.items())
    values = ",\n      ".join(f"{_value(f, f't_{n}', _typed(f, f't_{n}'))} as v_{n}" for n, f in fields.items())
    per_kind = []
    extra = []
    for kind in kinds:
        per_kind.append(f"when '{kind}' then {kind_reasons_sql(kind)}")
        names = sorted(OWN_NAMES[kind])
        known = own_names_null(kind)
        known_list = "[" + ",".join(f"'{n}'" for n in names) + "]"
        # unknown fields are kept; most records have none, so skip the patch for them
        extra.append(
            f"when '{kind}' then case when not list_has_all({known_list}, json_keys(jraw)) "
            f"then nullif(json_merge_patch(jraw, '{known}'), '{{}}') end"
        )
    line = f"{line_no} as line_no, " if line_no else ""
    # every field's column, typed as the store wants it (NULL for fields of no kind asked for)
    v_names = ", ".join(f"v_{n}" if n in fields else f"NULL::{f.column_type} as v_{n}" for n, f in ALL_FIELDS.items())
    kinds_sql = ",".join(f"'{k}'" for k in kinds)
    other_kind = (
        ""
        if kinds == ALL_KINDS
        else f"when kind not in ({kinds_sql}) then 'a ' || kind || ' record is not expected here (only {', '.join(kinds)})'"
    )
    reason = f"""case when perr is not null then perr
      when t_kind is null then '{PARSE_ERRORS["no_kind"]}'
      when t_kind <> {jt("VARCHAR")} then '{PARSE_ERRORS["kind_type"]}'
      when kind not in ({",".join(f"'{k}'" for k in ALL_KINDS)}) then {UNKNOWN_KIND}
      {other_kind}
      else case kind {" ".join(per_kind)} end end"""
    raw_out = (
        "left(raw, 1024)" if keep_raw else "case when reason is not null and reason <> 'blank' then left(raw, 1024) end"
    )
    return f"""
select {line}kind, {OWN_RUN_SQL} as own_run, {v_names}, extra, reason, {raw_out} as raw{", quotes" if file_quotes else ""}
from (
  select *, {reason} as reason,
    case when not clean and perr is null and kind in ({kinds_sql}) then case kind {" ".join(extra)} end end as extra
  from (
    select *,
      {values}
    from (
      select *,
        {types}
      from (
        -- JSON functions only ever see valid JSON (jraw): CASE does not always shield them
        select *, case when not clean then list_transform(json_type(jraw, {paths}), {_CODE_OF}) end as ty{quotes_col}
        from (
          select *, {clean} as clean, case when perr is null then raw end as jraw,
            {kind_of_text} as kind
          from (
            select *,
              {_jtype(_x("kind"))} as t_kind
            from (
              select {line}raw,
                case when raw is null then '{BLANK}'
                     when j is null then case when trim(raw, {JSON_SPACE}) = '' then '{BLANK}' else '{PARSE_ERRORS["invalid"]}' end
                     when ascii(raw) <> 123 and not starts_with(ltrim(raw, {JSON_SPACE}), '{{') then '{PARSE_ERRORS["not_object"]}'
                end as perr,
                j.kind::varchar as {_x("kind")},
                {texts}
              from (select {line}raw, try(from_json(raw, '{_parse_spec(fields)}')) as j from {source})
            )
          )
        )
      )
    )
  )
)
"""
