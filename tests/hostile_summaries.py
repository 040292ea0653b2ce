"""Hypothesis strategies for summaries of any shape, shared by the gate and diff property tests.

Built from the schema's own key names (so that rules and diffs reach into
them), with values a hostile or broken producer could hand over from Python:
NaN, infinities, 10**400, control text.
"""

from __future__ import annotations

from hypothesis import strategies as st

LEAVES = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.just(10**400)
    | st.floats()
    | st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=6)
)


def any_summary(keys: list[str]) -> st.SearchStrategy[dict]:
    """Summaries nesting ``keys`` up to a few levels deep, with hostile leaves."""
    return st.dictionaries(
        st.sampled_from(keys),
        st.recursive(
            LEAVES, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(keys), inner, max_size=4), max_leaves=12
        ),
        max_size=6,
    ).map(lambda body: {**body, "schema": "dsprof.summary/1"})
