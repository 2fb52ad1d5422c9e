"""The rule for token jumps beside reads moved across a step end, written once in Python.

queries/ingest/preemption_gaps.sql (the ingest's inferred ``preemptions``) and
queries/fit/request_attribution.sql (the priced ``preemption`` part) each carry the rule in
SQL; tests check both against this one reading of docs/model-and-attribution.md, so that
neither copy drifts: a token's step jump dk > 1 is reduced by the run of zero jumps right
before it and the run right after it; what is left over 1 is steps sat out.
"""

from __future__ import annotations

import random


def sat_out(steps: list[int]) -> list[int]:
    """Indexes ``i`` of the gaps (token ``i - 1`` to token ``i``) that count as steps sat out;
    ``steps``: the step each token of one request is read in."""
    dk = [b - a for a, b in zip(steps, steps[1:])]
    out = []
    for i, d in enumerate(dk):
        before = after = 0
        while i - before - 1 >= 0 and dk[i - before - 1] == 0:
            before += 1
        while i + after + 1 < len(dk) and dk[i + after + 1] == 0:
            after += 1
        if d > 1 and d - before - after > 1:
            out.append(i + 1)
    return out


# requests whose shapes a random draw rarely makes: zeros on both sides of one jump (the
# reduction is by both runs, summed), and zeros right after the first token
EDGE_REQUESTS = {
    "both_sides": [10, 11, 11, 14, 14, 15, 16, 17, 18, 19, 20],
    "zero_first": [10, 10, 12, 13, 14, 15, 16],
    "zeros_first_then_sat_out": [10, 10, 14, 15, 16, 17, 18, 19, 20],
}


def one_per_step_request(rng: random.Random, first: int, last: int) -> list[int]:
    """The steps of a request's tokens about one a step (the cadence the rule trusts: at most a
    fifth of its gaps inside one step, over half over exactly one), from step ``first``, with
    reads moved late or early across a step end, client bursts and steps sat out, mixed at random
    and sometimes next to each other; never past step ``last``."""
    steps = [first]
    while steps[-1] < last - 6 and len(steps) < 14:
        k = steps[-1]
        u = rng.random()
        if u < 0.55:
            steps.append(k + 1)
        elif u < 0.65:
            steps += [k + 2, k + 2]  # a read late by a step
        elif u < 0.72:
            steps += [k, k + 2]  # a read early by a step
        elif u < 0.78:
            steps += [k + 3, k + 3, k + 3]  # the client stalled, then read three at once
        elif u < 0.84:
            steps += [k, k + 3, k + 3]  # a read early, then a jump, then a read late
        else:
            steps.append(k + rng.randint(2, 5))  # sat out steps
    zeros = sum(b == a for a, b in zip(steps, steps[1:]))
    ones = sum(b == a + 1 for a, b in zip(steps, steps[1:]))
    n = len(steps) - 1
    if n < 3 or zeros > 0.2 * n or ones < 0.5 * n:
        return one_per_step_request(rng, first, last)  # not one a step: drawn again
    return steps
