"""JSON types as integer codes (canonical_sql.JSON_TYPES): every name json_type gives has its own."""

from __future__ import annotations

import duckdb
import pytest

from pipeline.ingest.canonical_sql import _CODE_OF, JSON_TYPES, _jtype, jt

VALUES = ["null", "true", "false", "5", "-5", "18446744073709551615", "1.5", "1e400", '"s"', "[1]", "{}"]


def test_every_name_json_type_gives_has_a_code_of_its_own():
    con = duckdb.connect()
    names = [con.execute("select json_type(?::json)", [v]).fetchall()[0][0] for v in VALUES]
    assert set(names) <= set(JSON_TYPES[:-1]), set(names) - set(JSON_TYPES)
    codes = con.execute(f"select list_transform(?::varchar[], {_CODE_OF})", [names]).fetchall()[0][0]
    assert codes == [JSON_TYPES.index(n) for n in names]
    other = con.execute(f"select list_transform(['SOMETHING_NEW'], {_CODE_OF})").fetchall()[0][0]
    assert other == [JSON_TYPES.index("OTHER")]
    # an absent key has no type at all (json_type says NULL): it must stay absent, not OTHER
    absent = con.execute(f"select list_transform(json_type('{{\"a\":1}}', ['$.a', '$.b']), {_CODE_OF})").fetchall()
    assert absent[0][0] == [JSON_TYPES.index("UBIGINT"), None]


@pytest.mark.parametrize("value", VALUES)
def test_first_character_gives_the_code_json_type_gives(value):
    """Strings and ids are typed by their first character (clean lines): the same code as json_type's,
    numbers aside, which are all DOUBLE there (ids tell integers apart)."""
    con = duckdb.connect()
    name = con.execute("select json_type(?::json)", [value]).fetchall()[0][0]
    fast, fast_int = con.execute(
        f"select {_jtype('x')}, {_jtype('x', ints=True)} from (select nullif(?, 'null') as x)", [value]
    ).fetchall()[0]
    if name == "NULL":
        assert fast is None and fast_int is None
    elif name in ("BIGINT", "UBIGINT", "DOUBLE"):
        assert fast == JSON_TYPES.index("DOUBLE")
        integer = value.lstrip("-").isdigit()
        assert fast_int == JSON_TYPES.index("BIGINT" if integer else "DOUBLE")
    else:
        assert fast == fast_int == JSON_TYPES.index(name)
    assert jt(name) == f"{JSON_TYPES.index(name)}::utinyint"
