"""Every chart spec a page embeds is valid Vega-Lite.

Pages build their charts with Altair's own schema checks off (``charts.VALIDATE``: they
cost about 1 s a page), so a wrong spec is caught by the tests that write each page kind
(report, comparison, sweep: test_hostile_pages; fleet: tests/fleet/test_fleet.py; trend:
tests/nightly/test_stats_trend.py), which validate every spec it embeds against the
Vega-Lite schema Altair ships, with :func:`assert_valid_vega_lite`.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from altair.vegalite.v6.schema.core import Root

from pipeline.report import charts

from ..vega import validate_vega_lite


SPECS_RE = re.compile(r'<script type="application/json" id="tracelat-specs">(.*?)</script>', re.S)


def page_specs(html: str) -> dict:
    return json.loads(SPECS_RE.search(html).group(1))


def test_the_validator_catches_a_wrong_spec():
    good = {"mark": "point", "data": {"values": [{"x": 1}]}, "encoding": {"x": {"field": "x", "type": "quantitative"}}}
    Root.validate(good)
    for bad in ({**good, "mark": "dot"}, {**good, "encoding": {"x": {"field": "x", "type": "numeric"}}}):
        with pytest.raises(jsonschema.ValidationError):
            Root.validate(bad)
        page = f'<script type="application/json" id="tracelat-specs">{json.dumps({"c1": good, "c2": bad})}</script>'
        with pytest.raises(AssertionError, match="^some page page, chart c2: "):
            assert_valid_vega_lite("some page", page)


def test_long_datasets_are_checked_on_their_first_rows_and_for_one_kind_of_row():
    rows = [{"x": i} for i in range(1000)]
    spec = {"mark": "point", "data": {"values": rows}, "encoding": {"x": {"field": "x", "type": "quantitative"}}}
    validate_vega_lite(spec)
    with pytest.raises(jsonschema.ValidationError):  # a wrong spec is still wrong with many rows
        validate_vega_lite({**spec, "mark": "dot"})
    named = {"mark": "point", "data": {"name": "d"}, "datasets": {"d": rows}}
    validate_vega_lite(named)
    for mixed in (rows + [5], rows[:2] + [True] + rows[2:]):  # beyond the rows the schema sees
        for bad in ({**spec, "data": {"values": mixed}}, {**named, "datasets": {"d": mixed}}):
            with pytest.raises(AssertionError, match="more than one JSON kind"):
                validate_vega_lite(bad)
    with pytest.raises(jsonschema.ValidationError):  # the schema's own rule, on short lists
        validate_vega_lite({**spec, "data": {"values": [{"x": 1}, 5]}})


def test_pages_skip_altairs_checks_by_default():
    # the speed this module's validation stands in for; a test that turned it on leaves it off
    assert charts.VALIDATE is False


def assert_valid_vega_lite(name: str, html: str) -> None:
    """Every spec embedded in a page validates against the schema (the error names the chart)."""
    specs = page_specs(html)
    assert specs, name
    for key, spec in specs.items():
        try:
            validate_vega_lite(spec, f"{name} page, chart {key}")
        except jsonschema.ValidationError as exc:
            raise AssertionError(f"{name} page, chart {key}: {exc.message}") from None
