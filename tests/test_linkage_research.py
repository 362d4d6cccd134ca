"""research/linkage_oracle.py and research/linkage_lookup.py on real compiles of the test corpus's C++ module."""

from __future__ import annotations

import pytest

from research.linkage_lookup import MODULE_WIDE, Task, key_of, two_compiles
from research.linkage_oracle import DELETABLE, linkages

pytestmark = pytest.mark.research


def test_linkage_is_read_as_llvm_dis_prints_it(corpus, toolchain):
    """``main`` is external, the STL's inline templates are linkonce_odr; every name carries one linkage word."""
    zoo = next(m for m in corpus if m.name.startswith("zoo"))
    found = linkages(zoo.bitcode, str(toolchain.tool("llvm-dis")))
    assert found["main"] == "external" and found["main"] not in DELETABLE
    assert any(link == "linkonce_odr" for link in found.values())
    assert all(" " not in name and name for name in found)


def test_the_lookup_key_leaves_out_only_the_module_wide_counters():
    features = {"node_count": [7], "edge_count": [9], "callee_users": [2], "cost_estimate": [31]}
    moved = {**features, "node_count": [8], "edge_count": [11]}
    assert key_of(features) == key_of(moved) == (2, 31)  # sorted by name: callee_users, cost_estimate
    assert key_of(features) != key_of({**features, "callee_users": [1]})
    assert set(MODULE_WIDE) == {"node_count", "edge_count"}


def test_two_compiles_never_withdraw_more_than_the_rule_added(corpus):
    """The second compile only withdraws extra inlines: on a module the rule leaves as clang does, it withdraws
    nothing and both compiles give the same bytes."""
    zoo = next(m for m in corpus if m.name.startswith("zoo"))
    row = two_compiles(Task(zoo, "heuristic"))
    assert row["status"] == "ok" and row["withdrawn"] == 0 and row["lookup"] == row["rule"]


def test_object_linkage_reads_the_symbol_table_a_served_compile_has(corpus, toolchain, tmp_path):
    """From an object, as ``optgym-cc`` would have it: ``main`` is a global text symbol (external), the inline
    templates clang kept are weak (counted deletable)."""
    import subprocess

    from research.linkage_lookup import object_linkages

    zoo = next(m for m in corpus if m.name.startswith("zoo"))
    obj = tmp_path / "zoo.o"
    subprocess.run([str(toolchain.clang), "-c", "-Oz", str(zoo.bitcode), "-o", str(obj)], check=True)
    found = object_linkages(obj, str(toolchain.tool("llvm-nm")))
    assert found["main"] == "external"
    assert any(link == "linkonce_odr" for link in found.values())
