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


def test_pages_skip_altairs_checks_by_default():
    # the speed this module's validation stands in for; a test that turned it on leaves it off
    assert charts.VALIDATE is False


def assert_valid_vega_lite(name: str, html: str) -> None:
    """Every spec embedded in a page validates against the schema (the error names the chart)."""
    specs = page_specs(html)
    assert specs, name
    for key, spec in specs.items():
        try:
            Root.validate(spec)
        except jsonschema.ValidationError as exc:
            raise AssertionError(f"{name} page, chart {key}: {exc.message}") from None
