"""Validation of canonical Parquet rows from their typed columns, without JSON text.

A canonical Parquet file used to be staged by writing each row as a JSON object
(``canonical.json_row_sql``) that ``canonical_sql.stage_sql`` then parsed again: two
thirds of its staging time went into making and parsing text whose every value
DuckDB already held typed.  This module validates the columns as they are and gives
the same staged columns (``kind, own_run, v_<field>..., extra, reason, raw``) and the
same values, reasons and extras as that text would have.  The rules that make them
equal:

* a null column of a row is no field of it (the text left it out);
* a field's JSON type is its column's type (to_json of the value would say it);
* a value is the one the text's parse gave: numbers as doubles (NaN and infinities
  kept, to_json wrote them as NaN/Infinity), strings as they are, lists and structs
  as their JSON;
* a reason shows the value as to_json writes it (the text held exactly that);
* fields that are not the record's own (unknown columns, another kind's fields) go
  to ``extra`` as the text's merge patch gave them, and a rejected row keeps its text
  as ``raw``: both built from the row only where needed.

Column types outside the ones a canonical writer uses (a float32 time, a string
``iter``, a decimal count) return None: the caller stages such a file through JSON
text, which decides every case.  Column names from the file are quoted identifiers
(``store.quote_ident``); only our own constant names and codes are otherwise placed in
the SQL text.
"""

from __future__ import annotations

import re

from .. import store
from .canonical_sql import (
    ALL_FIELDS,
    ALL_KINDS,
    OWN_NAMES,
    OWN_RUN_SQL,
    PARSE_ERRORS,
    UNKNOWN_KIND,
    _value,
    code_of,
    jt,
    kind_reasons_sql,
    own_names_null,
)

_INTS = frozenset({"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT"})
_ALL_NULL = '"NULL"'  # the type DuckDB gives a Parquet column of nulls only (Arrow's null type)
_LIST = re.compile(r"(.+)\[\]")


def _json_type(duck_type: str) -> str | None:
    """The JSON type a value of the column type has in to_json's text (json_type's name)."""
    if duck_type in _INTS:
        return "BIGINT"
    if duck_type == "DOUBLE":
        return "DOUBLE"
    if duck_type == "VARCHAR":
        return "VARCHAR"
    if _LIST.fullmatch(duck_type):
        return "ARRAY"
    if duck_type.startswith("STRUCT("):
        return "OBJECT"
    return None


def _accepts(kind: str, duck_type: str) -> bool:
    """Whether a column of ``duck_type`` holding field kind ``kind`` is validated here."""
    item = m.group(1) if (m := _LIST.fullmatch(duck_type)) else None
    if kind in ("int", "count", "float", "fraction"):
        return duck_type in _INTS or duck_type == "DOUBLE"
    if kind in ("str", "status", "clock"):
        return duck_type == "VARCHAR"
    if kind == "id":
        return duck_type == "VARCHAR" or duck_type in _INTS
    if kind == "strlist":
        return item == "VARCHAR"
    if kind == "floatlist":
        return item == "DOUBLE" or item in _INTS
    if kind == "object":
        return item is None and (duck_type.startswith("STRUCT(") or duck_type == "JSON")
    raise ValueError(kind)


def _x(kind: str, col: str, duck_type: str) -> str:
    """The field's parsed value (as ``stage_sql`` types it after the parse) from column ``col``."""
    if kind in ("int", "count", "float", "fraction"):
        return f"{col}::double"
    if kind == "floatlist":
        return f"{col}::double[]"
    if kind == "object":
        return f"to_json({col})"
    if kind == "id" and duck_type != "VARCHAR":
        return f"to_json({col})::varchar"  # an integer id is its digits
    return col


def parquet_stage_sql(source: str, columns: list[tuple[str, str]], row_json) -> str | None:
    """The staged rows of canonical Parquet ``source`` (DuckDB's names and types of its
    ``columns``), as ``stage_sql`` gives them for the rows' JSON text; None when a
    canonical column has a type validated only through that text.

    ``row_json(idents)``: the SQL of a row's JSON text given the columns' identifiers
    (``canonical.json_row_sql``). The file's columns are renamed ``c0, c1, ...`` first, so
    that no name from the file can clash with the names this statement adds.
    """
    if not columns:
        return None
    alias = {name: f"c{i}" for i, (name, _) in enumerate(columns)}
    raw_sql = row_json([alias[name] for name, _ in columns])
    renamed = ", ".join(f"{store.quote_ident(name)} as {alias[name]}" for name, _ in columns)
    source = f"(select {renamed} from {source})"
    present = {name: t for name, t in columns if t != _ALL_NULL}
    kind_type = present.get("kind")
    if kind_type is not None and kind_type != "VARCHAR":
        return None
    for name, t in present.items():
        f = ALL_FIELDS.get(name)
        if f is not None and not _accepts(f.kind, t):
            return None
    q = {name: alias[name] for name in present}
    types, values, shown = [], [], {}
    for name, f in ALL_FIELDS.items():
        if name not in present:
            types.append(f"NULL::utinyint as t_{name}")
            values.append(f"NULL::{f.column_type} as v_{name}")
            shown[name] = "NULL"
            continue
        col, jtype = q[name], _json_type(present[name])
        if present[name] == "JSON":  # a JSON column (DuckDB writes one): its value says its type
            types.append(f"{code_of(f'json_type({col})')} as t_{name}")
        else:
            types.append(f"case when {col} is not null then {jt(jtype)} end as t_{name}")
        values.append(f"{_value(f, f't_{name}', _x(f.kind, col, present[name]))} as v_{name}")
        shown[name] = f"left(to_json({col})::varchar, 40)"
    kind = q["kind"] if "kind" in present else "NULL::varchar"
    per_kind, extra = [], []
    for k in ALL_KINDS:
        per_kind.append(f"when '{k}' then {kind_reasons_sql(k, shown)}")
        others = [q[n] for n in present if n not in OWN_NAMES[k]]
        if others:
            has_other = " or ".join(f"{c} is not null" for c in others)
            extra.append(
                f"when '{k}' then case when {has_other} then "
                f"nullif(json_merge_patch({raw_sql}, '{own_names_null(k)}'), '{{}}') end"
            )
    extra_sql = f"case kind {' '.join(extra)} end" if extra else "NULL::json"
    reason = f"""case when kind is null then '{PARSE_ERRORS["no_kind"]}'
      when kind not in ({",".join(f"'{k}'" for k in ALL_KINDS)}) then {UNKNOWN_KIND}
      else case kind {" ".join(per_kind)} end end"""
    v_names = ", ".join(f"v_{n}" for n in ALL_FIELDS)
    return f"""
select kind, {OWN_RUN_SQL} as own_run, {v_names}, extra, reason,
  case when reason is not null then left({raw_sql}, 1024) end as raw
from (
  select *, {reason} as reason, {extra_sql} as extra
  from (
    select *, {", ".join(values)}
    from (select *, {kind} as kind, {", ".join(types)} from {source})
  )
)
"""
