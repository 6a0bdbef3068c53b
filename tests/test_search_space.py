"""Search spaces: parameters, restrictions (expressions and callables), lazy enumeration, sampling, neighbours."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import pytest

from tuneforge.search import Space, SpaceError, pow2, span

from .search_fixtures import OPTIMUM, tiled_space


def test_value_helpers() -> None:
    assert pow2(16, 256) == [16, 32, 64, 128, 256] and pow2(1, 1) == [1]
    assert span(2, 10, 4) == [2, 6, 10] and span(3, 3) == [3]
    for bad in ((3, 16), (16, 8), (0, 4)):
        with pytest.raises(SpaceError, match="pow2"):
            pow2(*bad)
    with pytest.raises(SpaceError, match="span"):
        span(5, 1)


def test_enumeration_is_in_order_and_obeys_the_restrictions() -> None:
    space = tiled_space()
    configs = list(space)
    assert space.size_bound == 1440 and len(configs) == space.count() == 1320
    assert all(c["BM"] * c["BN"] <= 16384 for c in configs)
    assert configs[0] == {"BM": 8, "BN": 8, "BK": 8, "UNROLL": 1, "ORDER": "ij"}
    assert configs[1]["ORDER"] == "ji"  # the last parameter varies fastest
    assert len({space.key(c) for c in configs}) == 1320
    assert OPTIMUM in space and {**OPTIMUM, "BM": 256, "BN": 256} not in space


def test_restrictions_are_checked_as_soon_as_their_parameters_are_fixed() -> None:
    calls = {"n": 0}

    def last(config: Mapping[str, Any]) -> bool:  # a callable: checked on whole configurations only
        calls["n"] += 1
        return True

    space = Space({"A": span(0, 999), "B": span(0, 999), "C": span(0, 999)}, ["A < 2", "B == A", last])
    configs = list(space)
    assert len(configs) == 2000 and space.size_bound == 10**9
    assert calls["n"] == 2000  # the rejected prefixes' 10^9 completions were never visited


def test_a_huge_space_is_sampled_and_walked_without_being_listed() -> None:
    space = Space({f"p{i}": span(1, 100) for i in range(8)}, ["p0 + p1 <= 150", "p2 % 2 == 0"])
    assert space.size_bound == 100**8 and space.listed() is None
    first = next(iter(space))
    assert first == {f"p{i}": 1 for i in range(8)} | {"p2": 2}
    rng = random.Random(3)
    drawn = space.sample(rng, 50)
    assert len(drawn) == 50 and len({space.key(c) for c in drawn}) == 50 and all(c in space for c in drawn)
    assert all(n in space for n in space.neighbours(drawn[0], 2))


def test_neighbours_step_one_parameter_and_respect_restrictions() -> None:
    space = tiled_space()
    center = {"BM": 128, "BN": 128, "BK": 8, "UNROLL": 1, "ORDER": "ij"}
    around = space.neighbours(center)
    assert all(sum(c[k] != center[k] for k in c) == 1 for c in around)  # one parameter changed
    assert {**center, "BM": 64} in around and {**center, "ORDER": "ji"} in around
    assert {**center, "BM": 256} not in around and {**center, "BN": 256} not in around  # over the limit
    assert len(around) == 5  # BM down, BN down, BK up, UNROLL up, ORDER
    wider = space.neighbours(OPTIMUM, radius=2)
    assert {**OPTIMUM, "BM": 16} in wider and {**OPTIMUM, "BM": 8} not in wider


def test_bad_spaces_and_restrictions_are_refused_with_the_reason() -> None:
    with pytest.raises(SpaceError, match="'BK', which is neither a parameter"):
        Space({"BM": [16, 32]}, ["BM * BK <= 64"])
    with pytest.raises(SpaceError, match="Attribute"):
        Space({"BM": [16, 32]}, ["BM.real < 6"])
    with pytest.raises(SpaceError, match="calls something other"):
        Space({"BM": [16, 32]}, ["__import__('os') is None"])
    with pytest.raises(SpaceError, match="not a Python expression"):
        Space({"BM": [16, 32]}, ["BM <="])
    with pytest.raises(SpaceError, match="has no values"):
        Space({"BM": []})
    with pytest.raises(SpaceError, match="lists a value twice"):
        Space({"BM": [16, 16]})
    with pytest.raises(SpaceError, match="identifier"):
        Space({"block-m": [16]})
    with pytest.raises(SpaceError, match="reject"):
        Space({f"p{i}": span(1, 100) for i in range(5)}, ["p0 > 1000"]).sample(random.Random(0), 1)


def test_membership_says_what_is_wrong() -> None:
    space = tiled_space()
    assert space.problem(OPTIMUM) is None
    assert space.problem({**OPTIMUM, "BM": 48}) == "BM=48 is not one of [8, 16, 32, 64, 128, 256]"
    assert "no value for ORDER" in str(space.problem({k: v for k, v in OPTIMUM.items() if k != "ORDER"}))
    assert "TILE is not a parameter" in str(space.problem({**OPTIMUM, "TILE": 1}))
    assert "BM * BN <= limit" in str(space.problem({**OPTIMUM, "BM": 256, "BN": 256}))


def test_a_space_of_recorded_points_holds_exactly_those() -> None:
    points = [{"A": 4, "B": "x"}, {"A": 1, "B": "y"}, {"A": 2, "B": "x"}]
    space = Space.from_points(points)
    assert space.values["A"] == (1, 2, 4) and sorted(space.key(c) for c in space) == [(1, "y"), (2, "x"), (4, "x")]
    assert {"A": 1, "B": "x"} not in space
    # recorded points move together: the nearest with the next A (or B), whatever else differs, fewest first
    assert space.neighbours({"A": 2, "B": "x"}) == [{"A": 1, "B": "y"}, {"A": 4, "B": "x"}]
    assert space.neighbours({"A": 4, "B": "x"}) == [{"A": 2, "B": "x"}, {"A": 1, "B": "y"}]
    assert Space.from_points([{"A": 2, "F": None}, {"A": 1, "F": 3}]).values["F"] == (None, 3)
    with pytest.raises(SpaceError, match="no value for parameter 'B'"):
        Space.from_points([{"A": 1, "B": 2}, {"A": 2}])
