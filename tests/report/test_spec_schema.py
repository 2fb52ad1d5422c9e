"""Every chart spec a page embeds is valid Vega-Lite.

Pages build their charts with Altair's own schema checks off (``charts.VALIDATE``: they
cost about 1 s a page), so this is where a wrong spec would be caught: each page kind
is written and every spec it embeds is validated against the Vega-Lite schema Altair ships.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from altair.vegalite.v6.schema.core import Root

from pipeline.report import charts

from .conftest import SCRIPT_RUN as RUN
from .conftest import script_sweep_page

SPECS_RE = re.compile(r'<script type="application/json" id="tracelat-specs">(.*?)</script>', re.S)


def page_specs(html: str) -> dict:
    return json.loads(SPECS_RE.search(html).group(1))


def test_the_validator_catches_a_wrong_spec():
    good = {"mark": "point", "data": {"values": [{"x": 1}]}, "encoding": {"x": {"field": "x", "type": "quantitative"}}}
    Root.validate(good)
    for bad in ({**good, "mark": "dot"}, {**good, "encoding": {"x": {"field": "x", "type": "numeric"}}}):
        with pytest.raises(jsonschema.ValidationError):
            Root.validate(bad)


def test_pages_skip_altairs_checks_by_default():
    # the speed this module's validation stands in for; a test that turned it on leaves it off
    assert charts.VALIDATE is False


def test_every_page_embeds_valid_vega_lite(script_store, tmp_path):
    from pipeline.compare import compare
    from pipeline.fleet import fleet
    from pipeline.lake import export_runs
    from pipeline.report import write_report
    from pipeline.report.compare_page import write_comparison
    from pipeline.report.fleet_page import write_fleet_page

    con, _ = script_store
    export_runs(con, [RUN, "base"], tmp_path / "lake")
    pages = {
        "report": write_report(con, RUN, tmp_path / "rep"),
        "compare": write_comparison(compare(con, "base", con, RUN), con, con, tmp_path / "cmp"),
        "sweep": script_sweep_page(con, tmp_path / "sweep.html"),
        "fleet": write_fleet_page(fleet(tmp_path / "lake", workers=1, out=tmp_path / "fleet"), tmp_path / "fleet"),
    }
    counted = {}
    for name, path in pages.items():
        specs = page_specs(path.read_text(encoding="utf-8"))
        for key, spec in specs.items():
            try:
                Root.validate(spec)
            except jsonschema.ValidationError as exc:  # name the chart, not only the schema path
                raise AssertionError(f"{name} page, chart {key}: {exc.message}") from None
        counted[name] = len(specs)
    assert counted["report"] >= 5 and all(counted.values()), counted
