"""Workloads for the simulator: arrival times and request sizes.

A :class:`Workload` is one row per request, sorted by arrival time, with times in
seconds. It can be synthetic (:func:`poisson_workload`, optionally with an
incident from :func:`add_burst`) or read from a file of recorded arrivals and
sizes (:func:`workload_from_file`), which is what trace replay does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.errors import InputError

# Column aliases accepted by workload_from_file, first match wins.
ARRIVAL_SECONDS = ("t_arrival", "arrived_at", "arrival_time", "arrival_s")
ARRIVAL_MS = ("timestamp",)  # Mooncake traces: milliseconds from the start
ARRIVAL_DATETIME = ("TIMESTAMP",)  # Azure LLM inference traces: wall-clock strings
PROMPT_COLUMNS = ("prompt_tokens", "num_prefill_tokens", "ContextTokens", "input_length", "input_len")
OUTPUT_COLUMNS = ("output_tokens", "num_decode_tokens", "GeneratedTokens", "output_length", "output_len")
ID_COLUMNS = ("req_id", "request_id", "id")
CACHED_COLUMNS = ("cached_tokens", "num_cached_tokens")  # recorded prefix-cache hits, tokens
HASH_COLUMN = "hash_ids"  # Mooncake: one id per prompt block; equal ids = the same prefix KV
MOONCAKE_BLOCK_TOKENS = 512  # tokens per hash id in Mooncake's published traces

# Arrival values at least this large look like absolute (epoch) timestamps.
_ABSOLUTE_TIME_S = 1e6


@dataclass(frozen=True)
class Workload:
    """Requests to simulate, one array entry per request, sorted by ``t_arrival``.

    Attributes:
        t_arrival: arrival times in seconds (float64, non-decreasing, >= 0).
        prompt_tokens: prompt length of each request (int64, >= 1).
        output_tokens: number of tokens to generate (int64, >= 1).
        req_id: optional ids (ints or strings); ``None`` means 0..n-1.
        cached_tokens: optional recorded prefix-cache hits per request (tokens of
            the prompt the engine did not recompute); used when the policy has
            prefix caching on and the workload has no block hashes.
        hash_offsets, hash_values: optional prompt block hashes (Mooncake's
            ``hash_ids``): request r's blocks are
            ``hash_values[hash_offsets[r]:hash_offsets[r + 1]]``, one per
            ``hash_block_tokens`` tokens of its prompt; equal values mean the same
            prefix, so its KV can be reused.
        hash_block_tokens: prompt tokens per hash id.
    """

    t_arrival: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    req_id: np.ndarray | None = None
    cached_tokens: np.ndarray | None = None
    hash_offsets: np.ndarray | None = None
    hash_values: np.ndarray | None = None
    hash_block_tokens: int = MOONCAKE_BLOCK_TOKENS
    # where each request was read (workload_from_file): the file, and each request's line in it
    source: str | None = None
    source_lines: np.ndarray | None = None

    def __post_init__(self) -> None:
        t = np.ascontiguousarray(self.t_arrival, dtype=np.float64)
        p = np.ascontiguousarray(self.prompt_tokens, dtype=np.int64)
        o = np.ascontiguousarray(self.output_tokens, dtype=np.int64)
        if not (t.ndim == p.ndim == o.ndim == 1 and len(t) == len(p) == len(o)):
            raise ValueError("t_arrival, prompt_tokens and output_tokens must be 1-D arrays of equal length")
        if len(t) and (not np.all(np.isfinite(t)) or np.any(np.diff(t) < 0)):
            raise ValueError("t_arrival must be finite and sorted (non-decreasing)")
        if len(t) and (p.min() < 1 or o.min() < 1):
            raise ValueError("prompt_tokens and output_tokens must all be >= 1")
        object.__setattr__(self, "t_arrival", t)
        object.__setattr__(self, "prompt_tokens", p)
        object.__setattr__(self, "output_tokens", o)
        if self.req_id is not None:
            ids = np.asarray(self.req_id)
            if len(ids) != len(t):
                raise ValueError("req_id must have one entry per request")
            object.__setattr__(self, "req_id", ids)
        if self.cached_tokens is not None:
            c = np.ascontiguousarray(self.cached_tokens, dtype=np.int64)
            if c.shape != t.shape or (len(c) and c.min() < 0):
                raise ValueError("cached_tokens must have one entry >= 0 per request")
            object.__setattr__(self, "cached_tokens", c)
        if (self.hash_offsets is None) != (self.hash_values is None):
            raise ValueError("hash_offsets and hash_values go together")
        if self.hash_offsets is not None:
            off = np.ascontiguousarray(self.hash_offsets, dtype=np.int64)
            vals = np.ascontiguousarray(self.hash_values, dtype=np.int64)
            if off.shape != (len(t) + 1,) or off[0] != 0 or off[-1] != len(vals) or np.any(np.diff(off) < 0):
                raise ValueError("hash_offsets must be n + 1 non-decreasing offsets into hash_values, from 0")
            object.__setattr__(self, "hash_offsets", off)
            object.__setattr__(self, "hash_values", vals)
        if self.hash_block_tokens < 1:
            raise ValueError("hash_block_tokens must be >= 1")

    @property
    def has_hashes(self) -> bool:
        """Whether the workload carries prompt block hashes (a prefix cache can be simulated)."""
        return self.hash_offsets is not None

    def head(self, n: int) -> "Workload":
        """The first ``n`` requests, with their cached tokens and block hashes."""
        if n >= len(self):
            return self
        off = None if self.hash_offsets is None else self.hash_offsets[: n + 1]
        return Workload(
            self.t_arrival[:n],
            self.prompt_tokens[:n],
            self.output_tokens[:n],
            self.ids()[:n],
            None if self.cached_tokens is None else self.cached_tokens[:n],
            off,
            None if off is None else self.hash_values[: off[-1]],
            self.hash_block_tokens,
            self.source,
            None if self.source_lines is None else self.source_lines[:n],
        )

    def where(self, i: int) -> str:
        """`` (FILE line N)`` for request ``i`` when the workload was read from a file, else ""."""
        if self.source is None or self.source_lines is None:
            return ""
        line = int(self.source_lines[i])
        return f" ({self.source} line {line})" if line > 0 else " (a request of the added burst)"

    def __len__(self) -> int:
        return len(self.t_arrival)

    def ids(self) -> np.ndarray:
        """The request ids, 0..n-1 when none were given."""
        return np.arange(len(self)) if self.req_id is None else self.req_id

    def describe(self) -> dict:
        """Summary statistics, for truth files and the CLI summary."""
        n = len(self)
        if n == 0:
            return {"requests": 0}
        return {
            "requests": n,
            "duration_s": float(self.t_arrival[-1] - self.t_arrival[0]),
            "prompt_tokens_mean": float(self.prompt_tokens.mean()),
            "output_tokens_mean": float(self.output_tokens.mean()),
            "prompt_tokens_max": int(self.prompt_tokens.max()),
            "output_tokens_max": int(self.output_tokens.max()),
            **({"cached_tokens_total": int(self.cached_tokens.sum())} if self.cached_tokens is not None else {}),
            **(
                {"hash_ids": int(len(self.hash_values)), "hash_block_tokens": self.hash_block_tokens}
                if self.has_hashes
                else {}
            ),
        }


def _lognormal_ints(rng: np.random.Generator, n: int, mean: float, sigma: float) -> np.ndarray:
    """Log-normal integers >= 1 whose (continuous) mean is ``mean``."""
    if mean < 1:
        raise ValueError(f"length mean must be >= 1, got {mean}")
    if sigma < 0:
        raise ValueError(f"length sigma must be >= 0, got {sigma}")
    mu = np.log(mean) - 0.5 * sigma * sigma
    x = rng.lognormal(mu, sigma, n) if sigma > 0 else np.full(n, float(mean))
    return np.maximum(np.rint(x), 1).astype(np.int64)


def poisson_workload(
    n_requests: int,
    rate_rps: float,
    prompt_mean: float,
    prompt_sigma: float,
    output_mean: float,
    output_sigma: float,
    seed: int,
    burstiness: float = 1.0,
) -> Workload:
    """Open-loop arrivals at ``rate_rps`` with log-normal prompt and output lengths.

    Inter-arrival gaps are gamma distributed with shape ``burstiness`` and mean
    ``1 / rate_rps``, as in vLLM's ``bench serve``: 1.0 is a Poisson process,
    values below 1 are burstier, above 1 more regular. ``rate_rps = inf`` sends
    every request at t = 0. The first request arrives at t = 0.

    Lengths are log-normal with the given mean (in tokens) and log-space sigma,
    rounded to integers >= 1; sigma 0 gives constant lengths.
    """
    if n_requests < 0:
        raise ValueError("n_requests must be >= 0")
    if not rate_rps > 0:
        raise ValueError(f"rate_rps must be > 0 (inf for all at once), got {rate_rps}")
    if not burstiness > 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    # one stream per quantity: the first k requests are the same whatever n_requests is
    r_gap, r_prompt, r_output = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    if np.isinf(rate_rps):
        t = np.zeros(n_requests)
    else:
        gaps = r_gap.gamma(burstiness, 1.0 / (rate_rps * burstiness), max(n_requests - 1, 0))
        t = np.concatenate([[0.0], np.cumsum(gaps)])[:n_requests]
    prompt = _lognormal_ints(r_prompt, n_requests, prompt_mean, prompt_sigma)
    output = _lognormal_ints(r_output, n_requests, output_mean, output_sigma)
    return Workload(t, prompt, output)


def add_burst(
    w: Workload,
    at_s: float,
    n: int,
    prompt_tokens: int,
    output_tokens: int,
    spread_s: float = 0.0,
) -> Workload:
    """Add an incident: ``n`` requests with the given sizes arriving at ``at_s``.

    With ``spread_s > 0`` the arrivals are spaced evenly over
    ``[at_s, at_s + spread_s]``. Burst requests get ids after the existing ones
    (integers when the ids are integers, ``burst-<k>`` otherwise); ties in
    arrival time keep the original requests first.

    What the workload carries per request stays with its request: recorded cached
    tokens (0 for a burst request), block hashes (a burst request's prompt is new
    content: blocks of hash values no other request has, so it fills the prefix
    cache and evicts as a real one does) and file lines (a burst request has line
    0, which :meth:`Workload.where` names as the burst's).
    """
    if n <= 0:
        return w
    t_new = at_s + (np.linspace(0.0, spread_s, n) if spread_s > 0 else np.zeros(n))
    ids = w.ids()
    if np.issubdtype(ids.dtype, np.integer):
        start = int(ids.max()) + 1 if len(ids) else 0
        new_ids = np.arange(start, start + n, dtype=ids.dtype)
    else:
        ids = ids.astype(str)
        new_ids = np.array([f"burst-{k}" for k in range(n)])
    t = np.concatenate([w.t_arrival, t_new])
    order = np.argsort(t, kind="stable")

    def extended(a: np.ndarray | None, fill: int) -> np.ndarray | None:
        return None if a is None else np.concatenate([a, np.full(n, fill, dtype=a.dtype)])[order]

    off = vals = None
    if w.hash_offsets is not None:
        blocks = -(-prompt_tokens // w.hash_block_tokens)  # one hash per started block of the prompt
        fresh = (int(w.hash_values.max()) + 1 if len(w.hash_values) else 0) + np.arange(n * blocks, dtype=np.int64)
        all_off = np.concatenate([w.hash_offsets, w.hash_offsets[-1] + blocks * np.arange(1, n + 1)])
        all_vals = np.concatenate([w.hash_values, fresh])
        lens = np.diff(all_off)[order]
        off = np.concatenate([[0], np.cumsum(lens)])
        # each request's run of values, in the new order: its old start, stepped through its length
        vals = all_vals[np.repeat(all_off[:-1][order] - off[:-1], lens) + np.arange(off[-1])]
    return Workload(
        t[order],
        np.concatenate([w.prompt_tokens, np.full(n, prompt_tokens, dtype=np.int64)])[order],
        np.concatenate([w.output_tokens, np.full(n, output_tokens, dtype=np.int64)])[order],
        np.concatenate([ids, new_ids])[order],
        extended(w.cached_tokens, 0),
        off,
        vals,
        w.hash_block_tokens,
        w.source,
        extended(w.source_lines, 0),
    )


def _bad(path: Path, line: int | None, what: str, fix: str) -> InputError:
    where = f"{path}:{line}" if line is not None else str(path)
    return InputError(f"{where}: {what}. {fix}")


def _read_table(path: Path):
    """Read a CSV or JSONL file into a Polars frame; return (frame, each row's line number)."""
    import polars as pl

    name = path.name.lower().removesuffix(".gz")
    is_jsonl = name.endswith((".jsonl", ".ndjson", ".json"))
    try:
        # Polars takes a path as a glob pattern: give it the file itself ("[ab].csv" is one file)
        if is_jsonl:
            with open(path, "rb") as f:
                df = pl.read_ndjson(f, infer_schema_length=None)
            return df, _object_lines(path, df.height)
        df = pl.read_csv(path, infer_schema_length=None, glob=False)
        return df, np.arange(2, df.height + 2)  # a blank CSV line is a row (of nulls) too
    except Exception as exc:  # polars raises several error types; find the line ourselves
        line = _first_bad_json_line(path) if is_jsonl else None
        raise _bad(
            path,
            line,
            f"cannot be read as {'JSON Lines' if is_jsonl else 'CSV'} ({str(exc).splitlines()[0][:200]})",
            "Fix the file, or pass a CSV with a header row or a JSONL file with one object per line.",
        ) from exc


def _object_lines(path: Path, rows: int) -> np.ndarray:
    """The line numbers of a JSON Lines file's non-blank lines, which are its rows (Polars skips
    blank ones); counted on the bytes, without a loop over lines."""
    import gzip

    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rb") as f:
        b = np.frombuffer(f.read(), dtype=np.uint8)
    ink = np.concatenate([[0], np.cumsum(~np.isin(b, (9, 10, 13, 32)))])  # non-space bytes so far
    ends = np.flatnonzero(b == 10)
    starts = np.concatenate([[0], ends + 1])
    ends = np.concatenate([ends, [len(b)]])
    lines = np.flatnonzero(ink[ends] > ink[starts]) + 1
    return lines if len(lines) == rows else np.arange(1, rows + 1)


def _first_bad_json_line(path: Path) -> int | None:
    import gzip

    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
        for lineno, raw in enumerate(fh, 1):
            if raw.strip():
                try:
                    if not isinstance(json.loads(raw), dict):
                        return lineno
                except ValueError:
                    return lineno
    return None


def _pick(df, names: tuple[str, ...]) -> str | None:
    return next((c for c in names if c in df.columns), None)


def _arrivals(df, path: Path, lines: np.ndarray) -> np.ndarray:
    import polars as pl

    col = _pick(df, ARRIVAL_SECONDS)
    scale = 1.0
    if col is None and (col := _pick(df, ARRIVAL_MS)) is not None:
        scale = 1e-3
    if col is None and (col := _pick(df, ARRIVAL_DATETIME)) is not None:
        s = df[col]
        if s.dtype == pl.String:
            s = s.str.to_datetime(strict=False, time_unit="us")
        if s.dtype.is_temporal():
            bad = s.is_null()
            if bad.any():
                raise _bad(
                    path,
                    int(lines[int(bad.arg_max())]),
                    f"column {col!r} holds a value that is not a date-time",
                    "Use ISO date-times like 2023-11-16 18:17:03.97.",
                )
            us = s.dt.epoch("us").to_numpy().astype(np.float64)
            return (us - us.min()) / 1e6
    if col is None:
        raise _bad(
            path,
            None,
            f"no arrival-time column (have: {', '.join(df.columns)})",
            f"Add a column named one of {', '.join(ARRIVAL_SECONDS + ARRIVAL_MS + ARRIVAL_DATETIME)}.",
        )
    t = _numeric(df, col, path, lines) * scale
    if len(t) and t.min() >= _ABSOLUTE_TIME_S:  # epoch timestamps: make the first arrival t = 0
        t = t - t.min()
    return t


def _numeric(df, col: str, path: Path, lines: np.ndarray) -> np.ndarray:
    import polars as pl

    s = df[col].cast(pl.Float64, strict=False)
    bad = s.is_null() | s.is_nan() | (s < 0)
    if bad.any():
        i = int(bad.arg_max())
        raise _bad(
            path,
            int(lines[i]),
            f"column {col!r} has {df[col][i]!r}, not a non-negative number",
            "Fix or remove that row.",
        )
    return s.to_numpy()


def _lengths(df, names: tuple[str, ...], path: Path, lines: np.ndarray, what: str) -> np.ndarray:
    col = _pick(df, names)
    if col is None:
        raise _bad(
            path,
            None,
            f"no {what} column (have: {', '.join(df.columns)})",
            f"Add a column named one of {', '.join(names)}.",
        )
    x = _numeric(df, col, path, lines)
    bad = (x < 1) | (x != np.floor(x))
    if bad.any():
        i = int(np.argmax(bad))
        raise _bad(
            path,
            int(lines[i]),
            f"column {col!r} has {x[i]!r}; {what} must be a whole number >= 1",
            "Fix or remove that row.",
        )
    return x.astype(np.int64)


def looks_like_workload(path) -> bool:
    """Whether the file's head names an arrival column and a prompt-length column, as a workload
    trace's does (read by :func:`workload_from_file`; the first CSV header or JSON Lines object)."""
    import json

    from ..ingest.reader import head_text

    try:
        head = head_text(Path(path), 1 << 14)
    except Exception:  # a damaged or unreadable file is no workload to point at
        return False
    first = next((x for x in head.splitlines() if x.strip()), "").strip()
    if first.startswith("{"):
        try:
            cols = set(json.loads(first))
        except (ValueError, RecursionError):  # garbage, or nesting too deep to be a workload's row
            return False
    else:
        cols = {c.strip().strip('"') for c in first.split(",")}
    arrival = (*ARRIVAL_SECONDS, *ARRIVAL_MS, *ARRIVAL_DATETIME)
    return bool(cols & set(arrival)) and bool(cols & set(PROMPT_COLUMNS))


def workload_from_file(path) -> Workload:
    """Read recorded arrivals and sizes from a CSV or JSON Lines file (``.gz`` too).

    Columns (first alias present wins):

    - arrival: ``t_arrival``/``arrived_at``/``arrival_time`` in seconds,
      ``timestamp`` in milliseconds (Mooncake), or ``TIMESTAMP`` date-times (Azure);
      absolute times (date-times, or seconds >= 1e6) are shifted so the first
      arrival is at t = 0;
    - prompt: ``prompt_tokens``/``num_prefill_tokens``/``ContextTokens``/``input_length``;
    - output: ``output_tokens``/``num_decode_tokens``/``GeneratedTokens``/``output_length``;
    - optional id: ``req_id``/``request_id``/``id``;
    - optional ``cached_tokens``/``num_cached_tokens``: recorded prefix-cache hits;
    - optional ``hash_ids`` (Mooncake): a list of prompt block ids per request
      (:func:`_hashes`), which lets the simulator replay a prefix cache.

    Rows are sorted by arrival (stable). Raises :class:`InputError` naming the
    file, the line, what is wrong and how to fix it.
    """
    path = Path(path)
    if not path.is_file():
        raise _bad(path, None, "no such file", "Check the path passed to --lengths-file.")
    df, lines = _read_table(path)
    if df.height == 0:
        raise _bad(path, None, "has no requests", "Pass a file with a header and at least one row.")
    t = _arrivals(df, path, lines)
    prompt = _lengths(df, PROMPT_COLUMNS, path, lines, "prompt-length")
    output = _lengths(df, OUTPUT_COLUMNS, path, lines, "output-length")
    id_col = _pick(df, ID_COLUMNS)
    ids = df[id_col].to_numpy() if id_col is not None else np.arange(len(t))
    if id_col is not None and df[id_col].null_count():
        raise _bad(
            path,
            int(lines[int(df[id_col].is_null().arg_max())]),
            f"column {id_col!r} has an empty id",
            "Give every request an id, or drop the id column.",
        )
    order = np.argsort(t, kind="stable")
    cached = None
    if (c_col := _pick(df, CACHED_COLUMNS)) is not None:
        c = _numeric(df, c_col, path, lines)
        if (c != np.floor(c)).any():
            i = int(np.argmax(c != np.floor(c)))
            raise _bad(
                path,
                int(lines[i]),
                f"column {c_col!r} has {c[i]!r}; cached tokens are a whole number",
                "Fix or remove that row.",
            )
        cached = c.astype(np.int64)[order]
    off, vals, block = _hashes(df, order, prompt, path, lines)
    return Workload(
        t[order], prompt[order], output[order], ids[order], cached, off, vals, block, str(path), lines[order]
    )


def _hashes(df, order: np.ndarray, prompt: np.ndarray, path: Path, lines: np.ndarray):
    """Mooncake ``hash_ids`` as flat (offsets, values) in arrival order, and the tokens per id.

    Ids may be integers or strings (mapped to integers, equal strings to equal ids). The
    tokens per id is 512 (Mooncake) when every row's id count is ``ceil(input_length / 512)``,
    else the block size the counts imply (a power of two when one fits); counts no single
    block size explains are an error naming two rows that disagree.
    """
    import polars as pl

    if HASH_COLUMN not in df.columns or df[HASH_COLUMN].null_count() == df.height:
        return None, None, MOONCAKE_BLOCK_TOKENS
    s = df[HASH_COLUMN]
    if not isinstance(s.dtype, pl.List) or not (s.dtype.inner.is_integer() or s.dtype.inner == pl.String):
        raise _bad(
            path,
            None,
            f"column {HASH_COLUMN!r} is {s.dtype}, not lists of block ids",
            "Write hash_ids as a JSON array of integers per request, as Mooncake traces do.",
        )
    holes = s.list.eval(pl.element().is_null().any()).list.first().fill_null(False)
    if holes.any():
        raise _bad(
            path,
            int(lines[int(holes.arg_max())]),
            f"{HASH_COLUMN} holds a null block id",
            "Every block id must be an integer.",
        )
    lens = s.list.len().fill_null(0).to_numpy().astype(np.int64)
    block = _block_tokens(lens, prompt, path, lines)
    rows = pl.DataFrame({"h": s.gather(order)}).filter(pl.col("h").list.len() > 0).explode("h")["h"]
    if rows.dtype == pl.String:
        rows = rows.rank("dense")  # equal strings, equal ids
    vals = rows.cast(pl.Int64).to_numpy()
    off = np.concatenate([[0], np.cumsum(lens[order])]).astype(np.int64)
    return off, vals, block


def _block_tokens(lens: np.ndarray, prompt: np.ndarray, path: Path, lines: np.ndarray) -> int:
    """Tokens per hash id: the block size b with ``ceil(prompt / b) == ids`` on every row with ids."""
    m = lens > 0
    if not m.any():
        return MOONCAKE_BLOCK_TOKENS
    n, L = lens[m], prompt[m]
    lo = (L + n - 1) // n  # b >= L / n: n blocks hold the prompt
    hi = np.where(n > 1, (L - 1) // np.maximum(n - 1, 1), np.iinfo(np.int64).max)  # (n - 1) * b < L
    b_lo, b_hi = int(lo.max()), int(hi.min())
    if b_lo <= MOONCAKE_BLOCK_TOKENS <= b_hi:
        return MOONCAKE_BLOCK_TOKENS
    if b_lo > b_hi:
        rows = np.flatnonzero(m)
        i, j = rows[int(np.argmax(lo))], rows[int(np.argmin(hi))]
        raise _bad(
            path,
            int(lines[min(i, j)]),
            f"{HASH_COLUMN} counts fit no single block size: line {int(lines[i])} has {int(lens[i])} "
            f"ids for {int(prompt[i])} tokens, line {int(lines[j])} has {int(lens[j])} ids for "
            f"{int(prompt[j])} tokens",
            "Each row needs ceil(input_length / block size) ids (512 in Mooncake).",
        )
    pow2 = 1 << max(b_lo - 1, 0).bit_length()
    return pow2 if pow2 <= b_hi else b_lo
