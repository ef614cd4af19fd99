"""Stale-anchor remapping (HASHLINE.md §7.2 b): one unambiguous region or nothing."""

from __future__ import annotations

import pytest

from kaizen_hashline import HashlineError
from kaizen_hashline.recovery import line_map, remap, runs

OLD = ["import os", "", "A = 1", "B = 2", "", "def f():", "    return 1"]


def test_runs_and_line_map():
    assert runs([5, 3, 4, 9]) == [(3, 5), (9, 9)]
    new = ["# hdr", *OLD]
    assert line_map(OLD, new) == {i: i + 1 for i in range(1, 8)}


@pytest.mark.rule("R-158")
def test_unique_anchor_with_an_agreeing_neighbour_moves():
    assert remap(OLD, ["# hdr", *OLD], [4], path="p").offset == 1
    assert remap(OLD, OLD, [3, 4], path="p").offset == 0


@pytest.mark.rule("R-158")
def test_changed_anchor_is_stale():
    new = list(OLD)
    new[3] = "B = 3"
    with pytest.raises(HashlineError) as err:
        remap(OLD, new, [4], path="p")
    assert err.value.code == "stale_tag"


@pytest.mark.rule("R-158")
def test_two_offsets_are_ambiguous():
    new = [*OLD[:4], "EXTRA = 1", *OLD[4:]]
    with pytest.raises(HashlineError) as err:
        remap(OLD, new, [3, 7], path="p")
    assert err.value.code == "ambiguous_anchor"


@pytest.mark.rule("R-158")
def test_duplicate_anchor_needs_every_neighbour_to_agree():
    old = ["a", "x", "b", "c", "x", "d"]
    # Line 2 ("x", a duplicate) with both neighbours shifted alike: fine.
    assert remap(old, ["new", *old], [2], path="p").offset == 1
    # Its lower neighbour changed: a duplicate anchor with one disagreeing neighbour fails.
    changed = ["a", "x", "B", "c", "x", "d"]
    with pytest.raises(HashlineError) as err:
        remap(old, changed, [2], path="p")
    assert err.value.code == "ambiguous_anchor"
    # The same situation for a unique anchor passes: one agreeing neighbour is enough.
    assert remap(["a", "y", "b"], ["a", "y", "B"], [2], path="p").offset == 0


@pytest.mark.rule("R-158")
def test_unique_anchor_without_any_agreeing_neighbour_is_ambiguous():
    with pytest.raises(HashlineError) as err:
        remap(["p", "u", "q"], ["P", "u", "Q"], [2], path="p")
    assert err.value.code == "ambiguous_anchor"
