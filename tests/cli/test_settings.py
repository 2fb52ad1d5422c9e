"""Configuration declared once (issue 16 item 4): the CLI options come from the config dataclasses.

The lists of fields here are always read from the dataclasses, never written out, so a
field added to a dataclass is checked without touching this file. The options are checked
end to end: the objects a command hands to the library are captured and compared with
instances built directly.
"""

from __future__ import annotations

import dataclasses
import importlib

import click
import pytest

from pipeline import settings
from pipeline.catalog import HardwareSpec
from pipeline.errors import InputError
from pipeline.sim.config import Policy, WorkloadSpec
from pipeline.sim.model import IterationModel, NoiseModel

SIM_CLASSES = (WorkloadSpec, Policy, IterationModel, NoiseModel)
CONFIG_CLASSES = (*SIM_CLASSES, HardwareSpec)

# Flags that existed before the options were generated: users' scripts use them (ground truth
# from docs/cli.md as of the generation change); each must still parse.
OLD_SIMULATE_FLAGS = (
    "--requests",
    "--rate",
    "--burstiness",
    "--prompt-mean",
    "--prompt-sigma",
    "--output-mean",
    "--output-sigma",
    "--lengths-file",
    "--iterations",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--kv-capacity-tokens",
    "--kv-block-size",
    "--admit-full-prompt",
    "--no-chunked-prefill",
    "--t0-ms",
    "--a-ms-per-ctx",
    "--b-ms-per-prefill",
    "--c-ms-per-decode",
    "--noise-sigma",
    "--stall-rate",
    "--stall-ms",
    "--burst-at",
    "--burst-count",
    "--burst-prompt-tokens",
    "--burst-output-tokens",
    "--burst-spread",
    "--seed",
)
OLD_REPLAY_FLAGS = (
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--kv-capacity-tokens",
    "--kv-block-size",
    "--chunked-prefill",
    "--no-chunked-prefill",
    "--admit-full-prompt",
    "--no-admit-full-prompt",
)
OLD_FIT_FLAGS = ("--model", "--config", "--gpu", "--bandwidth-gbps", "--peak-tflops")


def _command(name: str) -> click.Command:
    from pipeline.cli import COMMANDS

    module, attr, _ = COMMANDS[name]
    return getattr(importlib.import_module(module), attr)


def _option(cmd: click.Command, field: dataclasses.Field) -> click.Option:
    matches = [p for p in cmd.params if p.name == field.name]
    assert len(matches) == 1, f"{cmd.name}: no single option for field {field.name}"
    return matches[0]


def _perturbed(cls, tmp_path):
    """An instance of ``cls`` whose every setting differs from its default (valid for the class)."""
    values = {}
    for f, s, t in settings.settings(cls):
        d = f.default
        if t is bool:
            v = not d
        elif s.choices:
            v = next(c for c in s.choices if c != d)
        elif s.existing:
            p = tmp_path / f"{f.name}.csv"
            p.write_text("t_arrival,prompt_tokens,output_tokens\n0,1,1\n")
            v = str(p)
        elif t is int:
            v = (d or 0) + 3
        elif t is float:
            v = (d or 0.0) + 0.5
        else:
            v = f"{d or ''}x"
        values[f.name] = v
    return cls(**values)


@pytest.mark.parametrize("cls", SIM_CLASSES, ids=lambda c: c.__name__)
def test_simulate_has_every_field_with_its_default(cls):
    cmd = _command("simulate")
    for f, s, t in settings.settings(cls):
        opt = _option(cmd, f)
        assert opt.default == f.default, f.name
        assert settings.flag(f) in opt.opts
        if t is bool:
            assert opt.secondary_opts == ["--no-" + settings.flag(f)[2:]]
        assert s.help in opt.help
    # every field of the class is a setting: none is left out of the CLI
    assert [f.name for f in dataclasses.fields(cls)] == [f.name for f, _, _ in settings.settings(cls)]


def test_replay_has_every_policy_field_defaulting_to_recorded():
    cmd = _command("replay")
    for f, s, t in settings.settings(Policy):
        opt = _option(cmd, f)
        assert opt.default is None, f.name  # None: the recorded value
        assert s.help in opt.help and "Default: recorded" in opt.help
        if "unrecorded" in f.metadata:
            v = f.metadata["unrecorded"]
            assert f"else {('on' if v else 'off') if t is bool else v}" in opt.help


def test_old_flags_still_parse():
    for name, flags in (("simulate", OLD_SIMULATE_FLAGS), ("replay", OLD_REPLAY_FLAGS), ("fit", OLD_FIT_FLAGS)):
        known = {o for p in _command(name).params for o in (*p.opts, *p.secondary_opts)}
        assert not set(flags) - known, name


def _capture_simulate(monkeypatch, args):
    import pipeline.sim as sim

    seen = {}

    def fake(out, **kw):
        seen.update(kw)
        raise InputError("captured")  # stop before writing anything

    monkeypatch.setattr(sim, "run_simulation", fake)
    from pipeline.cli import run_captured

    code, text = run_captured("simulate", "--out", "unused.jsonl", *args)
    assert code == 2 and "captured" in text, text
    return seen


def test_simulate_defaults_are_the_dataclass_defaults(monkeypatch):
    seen = _capture_simulate(monkeypatch, [])
    assert seen["spec"] == WorkloadSpec() and seen["policy"] == Policy()
    assert seen["model"] == IterationModel() and seen["noise"] == NoiseModel()


def test_simulate_options_round_trip(monkeypatch, tmp_path):
    objs = {
        k: _perturbed(c, tmp_path)
        for k, c in (("spec", WorkloadSpec), ("policy", Policy), ("model", IterationModel), ("noise", NoiseModel))
    }
    # a lengths file and the synthetic settings it would ignore are refused together: two round trips
    from dataclasses import replace

    from pipeline.sim.config import BURST_FIELDS, SYNTHETIC_FIELDS

    spec = objs["spec"]
    # a burst goes on top of a file's workload too (its settings are refused without --burst-at)
    kept = ("lengths_file", "requests", "burst_at_s", *BURST_FIELDS)
    from_file = replace(WorkloadSpec(), **{f: getattr(spec, f) for f in kept})
    synthetic = {"--rate", "--burstiness", "--prompt-mean", "--prompt-sigma", "--output-mean", "--output-sigma"}
    for objs in ({**objs, "spec": replace(spec, lengths_file=None)}, {**objs, "spec": from_file}):
        args = [a for o in objs.values() for a in settings.as_args(o)]
        if objs["spec"].lengths_file:  # the defaults of the synthetic settings, left out as a user would
            at = [i for i, a in enumerate(args) if a in synthetic]
            assert len(at) == len(synthetic)
            args = [a for i, a in enumerate(args) if i not in at and i - 1 not in at]
        seen = _capture_simulate(monkeypatch, args)
        for k, o in objs.items():
            assert seen[k] == o, k
            assert seen[k] != type(o)(), k  # the round trip carried every changed value
    assert all(getattr(spec, f) != getattr(WorkloadSpec(), f) for f in SYNTHETIC_FIELDS)


def _capture_replay(monkeypatch, args):
    import pipeline.replay as replay

    seen = {}

    def fake(con, run_id, overrides=None, **kw):
        seen.update(overrides or {})
        raise InputError("captured")

    monkeypatch.setattr(replay, "calibrate", fake)
    monkeypatch.setattr("pipeline.store.open_for_reading", lambda *a, **k: _NoCon())
    from pipeline.cli import run_captured

    code, text = run_captured("replay", "RUN", *args)
    assert code == 2 and "captured" in text, text
    return seen


class _NoCon:
    def close(self) -> None:
        pass


def test_replay_policy_options_round_trip(monkeypatch, tmp_path):
    assert _capture_replay(monkeypatch, []) == {f.name: None for f in dataclasses.fields(Policy)}
    want = _perturbed(Policy, tmp_path)
    assert _capture_replay(monkeypatch, settings.as_args(want)) == dataclasses.asdict(want)


def test_fit_hardware_options_round_trip(monkeypatch, tmp_path):
    import pipeline.fit as fit

    seen = []

    def fake(con, run_id, hw, **kw):
        seen.append(hw)
        raise InputError("captured")

    monkeypatch.setattr(fit, "fit_run", fake)
    monkeypatch.setattr("pipeline.store.open_for_reading", lambda *a, **k: _NoCon())
    from pipeline.cli import run_captured

    want = HardwareSpec(config=str(tmp_path), gpu="cpu:20", bandwidth_gbps=20.5, tflops=1.25)
    code, text = run_captured("fit", "RUN", *settings.as_args(want))
    assert code == 2 and "captured" in text, text
    assert seen == [want]
    code, text = run_captured("fit", "RUN")
    assert code == 2 and seen[-1] == HardwareSpec()


def test_hardware_spec_round_trips_through_a_dict():
    hw = HardwareSpec(model="llama-3.1-8b", gpu="h100-sxm", bandwidth_gbps=3000.0, tflops=900.0)
    assert HardwareSpec.from_dict(hw.to_dict()) == hw
    assert HardwareSpec.from_dict({}) == HardwareSpec()
    assert set(hw.to_dict()) == {f.name for f in dataclasses.fields(HardwareSpec)}
    with pytest.raises(InputError, match="unknown hardware setting"):
        HardwareSpec.from_dict({"gpus": "h100"})


@pytest.mark.parametrize("cls", CONFIG_CLASSES, ids=lambda c: c.__name__)
def test_config_classes_take_keywords_only(cls):
    first = dataclasses.fields(cls)[0]
    with pytest.raises(TypeError):
        cls(first.default)
    assert cls(**{first.name: first.default}) == cls()


@pytest.mark.parametrize("cls", CONFIG_CLASSES, ids=lambda c: c.__name__)
def test_as_args_and_build_round_trip(cls, tmp_path):
    @settings.options(cls)
    def probe(**kw):
        return settings.build(cls, kw)

    cmd = click.command()(probe)
    for obj in (cls(), _perturbed(cls, tmp_path)):
        assert cmd.main(settings.as_args(obj), standalone_mode=False) == obj


def test_sweep_accepts_every_policy_field_and_validates_against_it():
    from pipeline.replay.sweep import parse_sweep

    for f, s, t in settings.settings(Policy):
        if t is bool:
            name, values = parse_sweep(f"{f.name}=true,off")
            assert values == [True, False]
        else:
            lo = int(s.min or 0)
            name, values = parse_sweep(f"{f.name.replace('_', '-')}={lo},{lo + 7}")
            assert values == [lo, lo + 7]
            if s.min is not None:
                with pytest.raises(InputError, match=f">= {lo}"):
                    parse_sweep(f"{f.name}={lo - 1}")
        assert name == f.name
        # every parsed value is a value of the field (the dataclass's own types)
        for v in values:
            assert type(v) is t
    with pytest.raises(InputError) as err:
        parse_sweep("block_size=16")
    assert all(f.name in str(err.value) for f in dataclasses.fields(Policy))


def test_replay_field_lists_come_from_policy():
    c = importlib.import_module("pipeline.replay.calibrate")  # the package exports a function of that name

    names = [f.name for f in dataclasses.fields(Policy)]
    assert list(c.POLICY_FIELDS) == names and list(c.META_KEYS) == names
    assert set(c.BOOL_FIELDS) == {f.name for f in dataclasses.fields(Policy) if isinstance(f.default, bool)}
    assert set(c.UNRECORDED_WHY) <= set(c.UNRECORDED)
    dataclasses.replace(Policy(), **c.UNRECORDED)  # the assumed values are valid settings
    # an unrecorded run gets the assumed values, in full
    rec = {f: None for f in names}
    rec.update(max_num_seqs=8, max_num_batched_tokens=64, kv_capacity_tokens=1000)
    policy, _, sources, notes = c.resolve_policy("r", rec, {}, {})
    assert {f: getattr(policy, f) for f in c.UNRECORDED} == c.UNRECORDED
    # a note for each assumption, except those whose reason is None (decided from the requests elsewhere)
    noted = [f for f in c.UNRECORDED if c.UNRECORDED_WHY.get(f, ("", "note"))[1] is not None]
    assert len(notes) == len(noted) and all(sources[f].startswith("default") for f in c.UNRECORDED)


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "NaN"])
def test_a_float_option_refuses_nan_and_infinities(text):
    from pipeline.cli import run_captured

    code, out = run_captured("fit", "r", "--db", "none.duckdb", "--bandwidth-gbps", text)
    assert code == 2 and f"Invalid value for '--bandwidth-gbps': {text!r} is not a finite number" in out, out
    code, out = run_captured("compare", "a", "b", "--db", "none.duckdb", "--threshold", text)
    assert code == 2 and f"Invalid value for '--threshold': {text!r} is not a finite number" in out, out
    # a setting with no bounds too
    with pytest.raises(click.BadParameter, match="not a finite number"):
        settings.finite_float().convert(text, None, None)


def test_a_hardware_figure_must_be_positive():
    from pipeline.cli import run_captured

    code, out = run_captured("fit", "r", "--db", "none.duckdb", "--peak-tflops", "0")
    assert code == 2 and "Invalid value for '--peak-tflops': 0.0 is not in the range x>0" in out, out


def test_a_setting_that_means_no_limit_by_inf_takes_inf_but_not_nan(monkeypatch):
    seen = _capture_simulate(monkeypatch, ["--rate", "inf"])
    assert seen["spec"].rate_rps == float("inf")
    from pipeline.cli import run_captured

    code, out = run_captured("simulate", "--rate", "nan", "--out", "x.jsonl")
    assert code == 2 and "Invalid value for '--rate': 'nan' is not a number" in out, out


@pytest.mark.parametrize(
    "flag", ["--t0-ms", "--a-ms-per-ctx", "--b-ms-per-prefill", "--c-ms-per-decode", "--d-ms-per-req"]
)
def test_a_negative_model_coefficient_is_refused(flag, tmp_path):
    """A negative cost per token made simulate write steps that end before they start."""
    from pipeline.cli import run_captured

    out_file = tmp_path / "x.jsonl"
    code, out = run_captured("simulate", flag, "-0.1", "--out", out_file)
    assert code == 2 and f"Invalid value for '{flag}': -0.1 is not in the range x>=0" in out, out
    assert not out_file.exists()


def test_help_shows_no_range_for_an_unbounded_float():
    from pipeline.cli import run_captured

    code, out = run_captured("simulate", "--help")
    assert code == 0 and "None" not in out, out
    assert "x>=0" in out  # the bounded ones still say so
