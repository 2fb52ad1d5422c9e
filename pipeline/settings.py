"""Settings declared once: a config dataclass field carries its flag, help text and range.

A config dataclass (the simulator's ``Policy``, ``WorkloadSpec``, ...) declares each field
with :func:`setting`; :func:`options` turns the fields into click options, :func:`build`
turns the parsed options back into the dataclass, and :func:`as_args` writes an instance
as the arguments that reproduce it. So a setting's name, default, type and help live in
the dataclass only, and every command that takes it agrees with the library.

Base layer: imports nothing of the pipeline, and click only when options are made, so
the dataclasses that use :func:`setting` stay importable without the CLI.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Callable

KEY = "setting"  # the field-metadata key holding a Setting


@dataclass(frozen=True)
class Setting:
    """What the CLI needs to know about one field.

    Attributes:
        help: one or two sentences for ``--help`` (and the field's documentation).
        flag: the long option when it is not ``--<field-name>`` (kept for names users know).
        min: smallest accepted value (inclusive; exclusive with ``min_open``), checked by click
            before the dataclass sees it.
        allow_inf: a float setting takes ``inf`` (meaning "no limit"); it never takes NaN.
        choices: the accepted strings of a text field.
        existing: ``"file"``: the value names an existing file; ``"path"``: an existing file or folder.
    """

    help: str
    flag: str | None = None
    min: float | None = None
    choices: tuple[str, ...] | None = None
    existing: str | None = None
    min_open: bool = False
    allow_inf: bool = False


def setting(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    min: float | None = None,  # noqa: A002
    choices: tuple[str, ...] | None = None,
    existing: str | None = None,
    min_open: bool = False,
    allow_inf: bool = False,
    **extra: Any,
) -> Any:
    """A dataclass field with ``default`` and its CLI description; ``extra`` goes into the
    field's metadata as is (facts other modules read, e.g. what a replay assumes)."""
    if existing not in (None, "file", "path"):
        raise ValueError(f"existing must be 'file' or 'path', got {existing!r}")
    meta = {KEY: Setting(help, flag, min, choices, existing, min_open, allow_inf), **extra}
    return dataclasses.field(default=default, metadata=meta)


def settings(cls: type) -> list[tuple[dataclasses.Field, Setting, type]]:
    """``(field, Setting, value type)`` for each field of ``cls`` declared with :func:`setting`.

    The value type is the annotation without ``None`` (``int | None`` -> ``int``)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        s = f.metadata.get(KEY)
        if s is None:
            continue
        t = hints[f.name]
        args = [a for a in typing.get_args(t) if a is not type(None)]
        out.append((f, s, args[0] if args else t))
    return out


def flag(f: dataclasses.Field) -> str:
    """The long option of a field: ``--max-num-seqs`` (a boolean also has ``--no-...``)."""
    s = f.metadata[KEY]
    return s.flag or "--" + f.name.replace("_", "-")


def flags(cls: type) -> dict[str, str]:
    """Field name -> how a user writes it: ``--kv-block-size``, ``--chunked-prefill/--no-chunked-prefill``."""
    out = {}
    for f, _, t in settings(cls):
        name = flag(f)
        out[f.name] = f"{name}/--no-{name[2:]}" if t is bool else name
    return out


def _click_type(s: Setting, t: type):
    import click

    if s.choices:
        return click.Choice(list(s.choices))
    if s.existing:
        return click.Path(exists=True, dir_okay=s.existing == "path")
    if t is int:
        return click.IntRange(min=int(s.min)) if s.min is not None else int
    if t is float:
        return finite_float(min=s.min, min_open=s.min_open, allow_inf=s.allow_inf)
    return str


def finite_float(
    min: float | None = None,  # noqa: A002
    max: float | None = None,  # noqa: A002
    min_open: bool = False,
    allow_inf: bool = False,
):
    """A click float type that refuses NaN and (unless ``allow_inf``) infinities, within
    ``min``/``max`` when given. Click's FloatRange alone lets NaN through: every comparison
    with it is false."""
    import click

    class FiniteFloat(click.FloatRange):
        name = "float"  # the metavar stays FLOAT; the bounds show in the help as [x>0]

        def convert(self, value, param, ctx):
            rv = click.FLOAT.convert(value, param, ctx)
            # before the range: -inf is "no number" first
            if rv != rv or (not allow_inf and rv in (float("inf"), float("-inf"))):
                self.fail(f"{value!r} is not a {'number' if allow_inf else 'finite number'}.", param, ctx)
            return super().convert(rv, param, ctx)

        def _describe_range(self) -> str:
            # click describes a range without bounds as "x<=None"
            return "" if self.min is None and self.max is None else super()._describe_range()

    return FiniteFloat(min=min, max=max, min_open=min_open)


def options(cls: type, *, unset: Callable[[dataclasses.Field], str] | None = None) -> Callable:
    """A decorator adding one click option per setting of ``cls``, in field order.

    Each option's parameter name is the field name. Without ``unset`` the dataclass
    default is the option's default (shown in ``--help``); a boolean is a
    ``--x/--no-x`` pair. With ``unset``, options default to None (the caller fills in
    what the user did not give) and ``unset(field)`` says in the help what that is.
    """
    import click

    decorators = []
    for f, s, t in settings(cls):
        name = flag(f)
        decls = [f"{name}/--no-{name[2:]}" if t is bool else name, f.name]
        if unset is None:
            kw = {"default": f.default, "show_default": f.default is not None, "help": s.help}
        else:
            kw = {"default": None, "help": f"{s.help} Default: {unset(f)}."}
        if t is not bool:
            kw["type"] = _click_type(s, t)
        decorators.append(click.option(*decls, **kw))

    def apply(fn: Callable) -> Callable:
        for d in reversed(decorators):  # click lists options in decoration order, innermost last
            fn = d(fn)
        return fn

    return apply


def given(cls: type, params: dict[str, Any]) -> dict[str, Any]:
    """The values of ``cls``'s settings in ``params`` (parsed options), removed from ``params``."""
    return {f.name: params.pop(f.name) for f, _, _ in settings(cls) if f.name in params}


def build(cls: type, params: dict[str, Any]):
    """``cls`` from parsed options (its settings are removed from ``params``); its validation applies."""
    return cls(**given(cls, params))


def as_args(obj: Any) -> list[str]:
    """Command-line arguments that give ``obj``'s settings, for a command made with :func:`options`.

    Defaults are written too, so the arguments do not depend on the defaults staying as
    they are; None (unset) fields are left out.
    """
    args: list[str] = []
    for f, _, t in settings(type(obj)):
        v = getattr(obj, f.name)
        if v is None:
            continue
        name = flag(f)
        if t is bool:
            args.append(name if v else f"--no-{name[2:]}")
        else:
            args += [name, repr(v) if t is float else str(v)]
    return args
