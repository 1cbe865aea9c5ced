"""Hypothesis strategies the fuzz tests share."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st


def json_like(leaves: st.SearchStrategy[Any], keys: st.SearchStrategy[str], depth: int = 2) -> st.SearchStrategy[Any]:
    """JSON-like values: `leaves`, or lists and objects of them nested up to `depth` deep, built level by level.

    Not `st.recursive`: since Hypothesis 6.170 it checks, at random draws, whether `extend` uses its argument, and
    wrongly warns for `lambda inner: st.lists(inner) | st.dictionaries(keys, inner)` (a warning is an error here).
    """
    values = leaves
    for _ in range(depth):
        values = leaves | st.lists(values, max_size=3) | st.dictionaries(keys, values, max_size=3)
    return values
