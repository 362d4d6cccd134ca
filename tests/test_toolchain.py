"""Finding and checking clang-22; object sizes against llvm-size itself."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from optgym.errors import ToolchainError
from optgym.problems import problem_class
from optgym.toolchain import find_toolchain, object_sizes
from optgym.toolchain.llvm import _probe, parse_version


def test_finds_clang_22_with_hooks(toolchain):
    assert toolchain.major >= 22
    assert all(toolchain.accepts(problem_class(name).hook) for name in ("inline-size", "regalloc-evict"))
    assert toolchain.tool("llvm-size").exists()


@pytest.fixture
def fake_clang(tmp_path, monkeypatch):
    def make(banner: str, accepts_mllvm: bool = True) -> Path:
        """A stand-in clang: the one fault a real clang-22 cannot show is being another version."""
        d = tmp_path / "fakellvm"
        d.mkdir()
        script = d / "clang"
        script.write_text(
            f"#!/bin/sh\ncase \"$1\" in --version) echo '{banner}'; exit 0;; esac\nexit {0 if accepts_mllvm else 1}\n"
        )
        script.chmod(0o755)
        monkeypatch.setenv("OPTGYM_LLVM_DIR", str(d))
        _probe.cache_clear()
        return script

    yield make
    _probe.cache_clear()


def test_refuses_old_clang_with_a_clear_message(fake_clang):
    fake_clang("Debian clang version 19.1.7 (3~deb12u1)")
    with pytest.raises(ToolchainError, match=r"clang 19\.1\.7.*needs clang ≥ 22.*inlining_default"):
        find_toolchain()


def test_explicit_dir_without_clang_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTGYM_LLVM_DIR", str(tmp_path))
    with pytest.raises(ToolchainError, match="has no clang"):
        find_toolchain()


def test_missing_hooks_are_reported(fake_clang):
    fake_clang("clang version 22.1.0", accepts_mllvm=False)
    with pytest.raises(ToolchainError, match="lacks the MLGO interactive hooks"):
        find_toolchain((problem_class("inline-size").hook,))


def test_parse_version():
    assert parse_version("Debian clang version 22.1.8 (1~deb12u1)") == "22.1.8"
    with pytest.raises(ToolchainError):
        parse_version("gcc (Debian 12.2.0-14) 12.2.0")


def _llvm_size(toolchain, obj: Path) -> tuple[int, int, int]:
    """(Berkeley text, Berkeley data, ``.text*``) as ``llvm-size`` prints them."""
    berkeley = subprocess.run([toolchain.tool("llvm-size"), obj], capture_output=True, text=True, check=True)
    text, data = (int(n) for n in berkeley.stdout.splitlines()[1].split()[:2])
    sysv = subprocess.run([toolchain.tool("llvm-size"), "-A", obj], capture_output=True, text=True, check=True)
    dottext = sum(int(line.split()[1]) for line in sysv.stdout.splitlines() if line.startswith(".text"))
    return text, data, dottext


@pytest.mark.parametrize("module", ["tree", "zoo", "leaf"])
def test_sizes_match_llvm_size(corpus, toolchain, tmp_path, module):
    from optgym.toolchain.process import run

    obj = tmp_path / "m.o"
    assert run(corpus[module].argv(toolchain.clang, [], obj), timeout=120).status == "ok"
    sizes = object_sizes(obj)
    assert (sizes.text_bytes, sizes.data_bytes, sizes.dottext_bytes) == _llvm_size(toolchain, obj)
    assert sizes.text_bytes > sizes.dottext_bytes > 0


def test_data_is_berkeley_data_and_counts_in_the_image(toolchain, tmp_path):
    """Writable data with contents (``.data``, a relocated constant table's ``.data.rel.ro``) is Berkeley
    ``data``; ``.bss`` is neither: ``image_bytes`` is what the object puts in a file, text and data."""
    (tmp_path / "d.c").write_text(
        'int counter = 5;\nint scratch[64];\nconst char *const names[] = {"north", "east", "south"};\n'
        "const char *name(int i) { scratch[i & 63] = i; return names[i % 3] + counter; }\n"
    )
    obj = tmp_path / "d.o"
    subprocess.run([toolchain.clang, "-fPIC", "-Oz", "-c", tmp_path / "d.c", "-o", obj], check=True, timeout=120)
    sizes = object_sizes(obj)
    assert (sizes.text_bytes, sizes.data_bytes, sizes.dottext_bytes) == _llvm_size(toolchain, obj)
    assert sizes.data_bytes >= 4 + 3 * 8  # counter, and the table of three pointers
    assert sizes.image_bytes == sizes.text_bytes + sizes.data_bytes


def test_sizes_of_an_object_with_more_sections_than_the_elf_header_counts(toolchain, tmp_path):
    """From 0xff00 sections on, ELF moves the section count and the string table's index into section 0
    (a never-inline compile of a large C++ file, flann's flann.cpp, has one section per function): the
    sizes still match llvm-size's, and a header pointing past its table is an ElfError, not an IndexError."""
    from optgym.toolchain.sizes import ElfError

    sections = 0xFF00 + 16
    lines = [f'.section .text.f{i},"ax",@progbits\nret\n' for i in range(sections // 2)]
    lines += [f'.section .rodata.r{i},"a",@progbits\n.byte {i % 256}\n' for i in range(sections // 2)]
    (tmp_path / "many.s").write_text("".join(lines))
    obj = tmp_path / "many.o"
    subprocess.run([toolchain.clang, "-c", tmp_path / "many.s", "-o", obj], check=True, timeout=300)
    data = obj.read_bytes()
    assert int.from_bytes(data[0x3C:0x3E], "little") == 0, "the header's count moved into section 0"
    sizes = object_sizes(obj)
    assert (sizes.text_bytes, sizes.data_bytes, sizes.dottext_bytes) == _llvm_size(toolchain, obj)
    assert sizes.dottext_bytes == sections // 2
    broken = bytearray(data)
    shoff = int.from_bytes(data[0x28:0x30], "little")
    broken[shoff + 0x20 : shoff + 0x28] = (1).to_bytes(8, "little")  # section 0 counts one: the string table is past it
    with pytest.raises(ElfError):
        object_sizes(bytes(broken))
