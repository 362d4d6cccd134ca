"""The bitcode symbol reader (optgym.toolchain.bitcode_symbols) against llvm-nm, on clang-22's own bitcode for each
target optgym compiles for, and on what it must refuse."""

from __future__ import annotations

import subprocess

import pytest

from optgym.rollout.linkage import SURVIVING_SYMBOLS, defined_symbols, surviving_functions
from optgym.toolchain.bitcode_symbols import external_functions, symbol_table

SOURCE = r"""
extern int sink(int);
static int local_helper(int x) { return sink(x) + 1; }
inline int inline_helper(int x) { return sink(x * 2); }
template <class T> T twice(T x) { return x + x; }
int exported(int x) { return local_helper(x) + inline_helper(x) + twice(x); }
__attribute__((weak)) int weak_one(int x) { return sink(x); }
__attribute__((visibility("hidden"))) int hidden_one(int x) { return sink(x - 1); }
int data_not_code = 3;
namespace { int anonymous(int x) { return sink(x ^ 5); } }
int uses_anonymous(int x) { return anonymous(x); }
"""

TARGETS = [[], ["--target=aarch64-linux-gnu"], ["--target=thumbv7em-none-eabi", "-mcpu=cortex-m4", "-mthumb"]]


@pytest.mark.parametrize("target", TARGETS, ids=["x86-64", "aarch64", "cortex-m4"])
def test_the_reader_finds_llvm_nms_global_text_symbols(toolchain, tmp_path, target):
    """External definitions and nothing else: not the static, inline, template, weak or anonymous-namespace
    functions, not a global variable; a hidden one is still a global text symbol."""
    (tmp_path / "m.cpp").write_text(SOURCE)
    for stage in (["-Xclang", "-disable-llvm-passes"], []):  # a front end's bitcode, and optimized bitcode
        bitcode = tmp_path / "m.bc"
        subprocess.run([str(toolchain.clang), *target, "-Oz", "-c", "-emit-llvm", *stage, "m.cpp", "-o", "m.bc"],
                       cwd=tmp_path, check=True)  # fmt: skip
        nm = defined_symbols(bitcode, str(toolchain.tool("llvm-nm")))
        expected = {name for name, kind in nm.items() if kind in SURVIVING_SYMBOLS}
        assert external_functions(bitcode) == expected
        assert {"_Z8exportedi", "_Z10hidden_onei", "_Z14uses_anonymousi"} <= expected
        assert not any("helper" in name or "twice" in name or "weak" in name for name in expected)


def test_what_is_not_bitcode_with_a_table_is_left_to_llvm_nm(toolchain, tmp_path):
    (tmp_path / "m.cpp").write_text(SOURCE)
    subprocess.run([str(toolchain.clang), "-Oz", "-c", "m.cpp", "-o", "m.o"], cwd=tmp_path, check=True)
    subprocess.run([str(toolchain.clang), "-Oz", "-c", "-emit-llvm", "m.cpp", "-o", "m.bc"], cwd=tmp_path, check=True)
    assert external_functions(tmp_path / "m.o") is None  # an object: llvm-nm reads it
    assert "_Z8exportedi" in (surviving_functions(tmp_path / "m.o", toolchain) or ())
    data = (tmp_path / "m.bc").read_bytes()
    assert symbol_table(data) is not None
    (tmp_path / "cut.bc").write_bytes(data[: len(data) // 2])  # cut inside the module block: no table
    assert external_functions(tmp_path / "cut.bc") is None
    assert external_functions(tmp_path / "missing.bc") is None
