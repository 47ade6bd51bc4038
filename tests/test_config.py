"""`bapsql.config.flat_config`: a nested config as ``section.key`` -> JSON-ready value."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from bapsql.config import flat_config


@dataclass(frozen=True)
class Inner:
    rank: int = 8
    targets: tuple[str, ...] = ("q_proj", "v_proj")


@dataclass(frozen=True)
class Outer:
    name: str = "run"
    inner: Inner = field(default_factory=Inner)
    where: Path = Path("/tmp/x")
    extra: dict = field(default_factory=lambda: {"a": {"b": None}})


def test_nested_sections_become_dotted_keys_with_json_ready_values():
    flat = flat_config(Outer())
    assert flat == {"name": "run", "inner.rank": 8, "inner.targets": ["q_proj", "v_proj"], "where": "/tmp/x",
                    "extra.a.b": None}
    assert json.loads(json.dumps(flat)) == flat


@given(st.recursive(st.one_of(st.integers(), st.text(max_size=5), st.none(), st.booleans()),
                    lambda inner: st.dictionaries(st.text("abc", min_size=1, max_size=3), inner, min_size=1,
                                                  max_size=3), max_leaves=10))
def test_every_leaf_is_kept_once_under_its_path(tree):
    flat = flat_config({"root": tree})

    def leaves(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                yield from leaves(v, f"{path}.{k}")
        else:
            yield path, node

    assert flat == dict(leaves(tree, "root"))
