"""Validation of records that a converter already holds as typed columns (engine formats).

An engine converter parses its source with vectorised expressions into a frame whose
columns are canonical fields.  Turning that frame into JSON text for
``canonical_sql.stage_sql`` to parse again cost most of an engine ingest (every row
carries extra fields, so every line took the slow path of the JSON checks).  This
module checks the typed columns with the same rules instead, and produces the same
staged columns (``line_no, kind, own_run, v_<field>..., extra, reason, raw``):

* a field's JSON type is its column's type (what the JSON text of the value would
  have said), so type checks, ranges, counts and the cross-field checks are those of
  ``canonical_sql`` and give the same reasons;
* NaN and infinities in number columns count as absent, as they did in JSON text
  (which has no such numbers: the encoder wrote null);
* fields that are not canonical (``extra``) arrive as one JSON object per row;
* ``raw`` (rejected rows only) is the record as JSON text.

Only our own constant names (canonical fields, the converter's column names checked
against ``[A-Za-z_][A-Za-z0-9_]*``) are placed in the SQL text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .canonical_sql import ALL_FIELDS, OWN_NAMES, OWN_RUN_SQL, _value, jt, kind_reasons_sql

if TYPE_CHECKING:
    import pyarrow as pa

EXTRA_JSON = "extra_json"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Typed:
    """Records of one kind as typed columns: ``line_no``, canonical fields, and
    ``extra_json`` (unknown fields as one JSON object text per row, or absent)."""

    kind: str
    table: pa.Table
    extra: tuple[str, ...] = ()  # extra columns kept in the table for ``raw``
    # canonical field -> the source field its value came from: a reason names the field as
    # the user wrote it, "input_toks (prompt_tokens): negative count -5", not only ours
    sources: tuple[tuple[str, str], ...] = ()


def _json_type(t: pa.DataType) -> str | None:
    import pyarrow as pa

    """The JSON type name (as ``json_type`` says it) that values of an Arrow type have."""
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "VARCHAR"
    if pa.types.is_integer(t):
        return "BIGINT"
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "DOUBLE"
    if pa.types.is_boolean(t):
        return "BOOLEAN"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return "ARRAY"
    if pa.types.is_struct(t) or pa.types.is_map(t):
        return "OBJECT"
    return None  # all-null column: absent


def _quoted(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(f"column name {name!r} is not a plain identifier")
    return f'"{name}"'


def _column(f, col: str, jtype: str) -> str:
    """The value of field ``f`` from column ``col`` of JSON type ``jtype``, as stage_sql's ``x_``."""
    if f.kind in ("int", "count", "float", "fraction"):
        if jtype == "DOUBLE":  # NaN and infinity stay: stage_sql's checks reject them, naming the value
            return f"{col}::double"
        return f"{col}::double" if jtype == "BIGINT" else "NULL::double"
    if f.kind == "strlist":
        return f"{col}::varchar[]" if jtype == "ARRAY" else "NULL::varchar[]"
    if f.kind == "floatlist":  # NaN in a list was a null in JSON text too
        if jtype != "ARRAY":
            return "NULL::double[]"
        return f"list_transform({col}::double[], lambda v: case when isfinite(v) then v end)"
    if f.kind == "object":
        return f"to_json({col})" if jtype == "OBJECT" else "NULL::json"
    return f"{col}::varchar" if jtype in ("VARCHAR", "BIGINT", "DOUBLE") else "NULL::varchar"


def typed_stage_sql(source: str, typed: Typed) -> str:
    """The staged rows of ``typed`` (read from relation ``source``), as ``stage_sql`` gives them."""
    kind = typed.kind
    schema = {
        typed.table.schema.field(i).name: typed.table.schema.field(i).type for i in range(typed.table.num_columns)
    }
    known = OWN_NAMES[kind]
    values, types, shown = [], [], {}
    for name, f in ALL_FIELDS.items():
        jtype = _json_type(schema[name]) if name in schema and name in known else None
        if jtype is None:
            sql_type = {"int": "bigint", "count": "bigint", "float": "double", "fraction": "double"}.get(
                f.kind, {"strlist": "varchar[]", "floatlist": "double[]", "object": "json"}.get(f.kind, "varchar")
            )
            types.append(f"NULL::utinyint as t_{name}")
            values.append(f"NULL::{sql_type} as v_{name}")
            shown[name] = "NULL"
            continue
        col = _quoted(name)
        x = _column(f, col, jtype)
        t = f"case when {x} is not null then {jt(jtype)} end"
        types.append(f"{t} as t_{name}")
        values.append(f"{_value(f, f't_{name}', x)} as v_{name}")
        shown[name] = f"left(to_json({col})::varchar, 40)"
    labels = {k: (v if v == k else f"{v} ({k})") for k, v in typed.sources}
    if any("'" in x for x in labels.values()):  # they are placed in SQL string literals
        raise ValueError(f"source field names must not hold a quote: {labels}")
    reason = kind_reasons_sql(kind, shown, labels)
    extra = f"nullif({EXTRA_JSON}, '{{}}')::json" if EXTRA_JSON in schema else "NULL::json"
    record = ", ".join(
        [f"kind := '{kind}'"]
        + [f"{_quoted(n)} := {_quoted(n)}" for n in schema if n in known and n != "kind"]
        + [f"{_quoted(n)} := {_quoted(n)}" for n in typed.extra if n in schema]
    )
    own_run = OWN_RUN_SQL if "run_id" in schema else "NULL::varchar"
    v_names = ", ".join(f"v_{n}" for n in ALL_FIELDS)
    return f"""
select line_no, '{kind}' as kind, {own_run} as own_run, {v_names}, extra, reason,
  case when reason is not null then left(to_json(struct_pack({record}))::varchar, 1024) end as raw
from (
  select *, {reason} as reason
  from (
    select *, {", ".join(values)}, {extra} as extra
    from (select *, {", ".join(types)} from {source})
  )
)
"""
