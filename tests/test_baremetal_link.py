"""Bare-metal programs link: a Cortex-M corpus build's links get picolibc, libgcc and optgym's linker script.

Real clang-22, ld.lld, picolibc and arm-none-eabi-gcc's multilib answers (Debian's ``picolibc-arm-none-eabi``,
which ``make setup`` installs, brings ``gcc-arm-none-eabi``); no fakes. Each case takes a second or two.
"""

from __future__ import annotations

import shlex
import shutil
import struct
import subprocess
from pathlib import Path

import psutil
import pytest

from optgym.corpus.build import EMBED, NO_LTO, build_tree, write_compiler_wrappers
from optgym.corpus.info import corpus_info
from optgym.corpus.target import (
    CORTEX_M_SCRIPT,
    PICOLIBC_ARM,
    Target,
    arm_march,
    bare_metal_runtime,
    multilib_args,
)

PICOLIBC_INCLUDE = PICOLIBC_ARM / "include"
CORTEX_M4 = Target("thumbv7em-none-eabi", ("-mcpu=cortex-m4", "-mthumb", "-isystem", str(PICOLIBC_INCLUDE)))
EM_ARM = 40

needs_picolibc = pytest.mark.skipif(
    not (PICOLIBC_ARM / "lib").is_dir() or shutil.which("arm-none-eabi-gcc") is None,
    reason="picolibc-arm-none-eabi (and its gcc-arm-none-eabi) are installed by `make setup`",
)

#: printf, malloc, memcpy, 64-bit division (libgcc's __aeabi_uldivmod), thread-local and zeroed data.
PROGRAM = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
_Thread_local int tls_counter = 5;
static int zeroed[16];
int main(int argc, char **argv) {
  char *p = malloc(64);
  if (!p) return 1;
  memcpy(p, argc > 0 ? argv[0] : "none", 5);
  p[5] = 0;
  uint64_t big = (uint64_t)argc << 40, by = (uint64_t)zeroed[argc & 15] + 3;
  printf("%s %llu %d\n", p, (unsigned long long)(big / by), tls_counter++);
  free(p);
  return (int)(big % by);
}
"""


def _symbols(toolchain, elf: Path) -> dict[str, int]:
    nm = subprocess.run([str(toolchain.tool("llvm-nm")), str(elf)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1]: int(line.split()[0], 16) for line in nm.splitlines() if len(line.split()) == 3}


def _elf_machine(path: Path) -> int:
    head = path.read_bytes()[:20]
    assert head[:4] == b"\x7fELF", path
    return struct.unpack_from("<H", head, 18)[0]


@needs_picolibc
@pytest.mark.parametrize(
    ("triple", "flags", "multilib"),
    [
        ("thumbv7em-none-eabi", ("-mcpu=cortex-m4", "-mthumb"), "thumb/v7e-m/nofp"),
        ("thumbv7em-none-eabi", ("-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=hard", "-mfpu=fpv4-sp-d16"),
         "thumb/v7e-m+fp/hard"),
        ("thumbv7em-none-eabihf", ("-mcpu=cortex-m4",), "thumb/v7e-m+fp/hard"),  # clang's hard-float default
        ("thumbv6m-none-eabi", (), "thumb/v6-m/nofp"),  # no CPU named: the triple's architecture
        ("thumbv8m.main-none-eabi", ("-isystem", "/x"), "thumb/v8-m.main/nofp"),
    ],
)  # fmt: skip
def test_the_multilib_is_gccs_choice_for_the_targets_flags(triple, flags, multilib):
    runtime = bare_metal_runtime(Target(triple, flags))
    assert runtime is not None and runtime.multilib == multilib
    assert (runtime.libdir / "crt0.o").is_file() and runtime.libgcc.name == "libgcc.a"
    assert runtime.libgcc.parent.as_posix().endswith(multilib) and runtime.script == CORTEX_M_SCRIPT


@needs_picolibc
@pytest.mark.parametrize(
    "target",
    [
        Target("aarch64-linux-gnu"),
        Target("x86_64-linux-gnu"),
        Target("armv7a-none-eabi", ("-mcpu=cortex-a9",)),  # bare metal, but no Cortex-M: the script's map is wrong
        Target("riscv32-unknown-elf"),
    ],
    ids=str,
)
def test_no_runtime_outside_cortex_m_bare_metal(target):
    assert bare_metal_runtime(target) is None and target.program_link_flags == ()


def test_multilib_flags_as_gcc_spells_them():
    assert multilib_args(CORTEX_M4) == ["-mcpu=cortex-m4", "-mthumb"]  # -isystem is the compile's business
    assert multilib_args(Target("thumbv7em-none-eabihf")) == ["-march=armv7e-m", "-mthumb", "-mfloat-abi=hard"]
    assert [arm_march(a) for a in ("thumbv7em", "thumbv6m", "thumbv8m.main", "thumbv8.1m.main", "armv7a", "x86_64")
            ] == ["armv7e-m", "armv6-m", "armv8-m.main", "armv8.1-m.main", "armv7-a", None]  # fmt: skip


@needs_picolibc
def test_a_program_links_through_the_corpus_wrappers(toolchain, tmp_path):
    """The wrappers ``optgym corpus build`` writes: a compile is unchanged (no link flag reaches it), a link of the
    objects — and a one-step compile and link — give an ARM ELF with ``main``, picolibc's ``printf`` and libgcc's
    64-bit division; the vector table opens flash: the initial stack pointer at the top of RAM, then ``_start``."""
    tail = (*CORTEX_M4.compile_flags, *EMBED, *NO_LTO)
    cc, _ = write_compiler_wrappers(tmp_path / "bin", str(toolchain.clang), str(toolchain.tool("clang++")), "-Oz",
                                    tail, CORTEX_M4.link_flags, CORTEX_M4.program_link_flags)  # fmt: skip
    (tmp_path / "p.c").write_text(PROGRAM)
    compiled = subprocess.run([cc, "-c", "p.c", "-o", "p.o"], cwd=tmp_path, capture_output=True, text=True)
    assert compiled.returncode == 0 and compiled.stderr == "", compiled.stderr  # no "unused argument" warning
    for argv, elf in (([cc, "p.o", "-o", "p.elf"], "p.elf"), ([cc, "p.c", "-o", "direct.elf"], "direct.elf")):
        linked = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True)
        assert linked.returncode == 0, linked.stderr
        assert _elf_machine(tmp_path / elf) == EM_ARM
    symbols = _symbols(toolchain, tmp_path / "p.elf")
    assert {"main", "printf", "malloc", "memcpy", "__aeabi_uldivmod", "_start"} <= symbols.keys()
    assert symbols["__interrupt_vector"] == 0 and symbols["__stack"] == 0x20000000 + 4 * 1024 * 1024
    image = subprocess.run([str(toolchain.tool("llvm-objcopy")), "-O", "binary", "--only-section=.text",
                            str(tmp_path / "p.elf"), "-"], capture_output=True, check=True).stdout  # fmt: skip
    stack, reset = struct.unpack_from("<II", image)
    assert stack == symbols["__stack"] and reset == symbols["_start"] | 1
    # a shared library gets neither picolibc nor the script (no shared libraries without an OS: it fails as before),
    # however the link is told so: to the driver, or to the linker as libtool does
    for extra, runtime in (([], True), (["-shared"], False), (["-r"], False), (["-Wl,-shared"], False),
                           (["-Wl,-soname,libp.so.1,-shared"], False), (["-Xlinker", "-r"], False),
                           (["-Wl,--relocatable"], False), (["-Wl,-rpath,/x/shared"], True)):  # fmt: skip
        commands = subprocess.run([cc, *extra, "p.o", "-o", "out", "-###"], cwd=tmp_path, capture_output=True,
                                  text=True).stderr  # fmt: skip
        assert "ld.lld" in commands
        assert (str(CORTEX_M_SCRIPT) in commands) is runtime
        assert (str(PICOLIBC_ARM / "lib" / "thumb" / "v7e-m" / "nofp" / "crt0-semihost.o") in commands) is runtime


needs_qemu = pytest.mark.skipif(shutil.which("qemu-system-arm") is None, reason="`make setup` installs qemu-system-arm")


@needs_picolibc
@needs_qemu
def test_a_cortex_m_program_runs_under_qemu_with_its_arguments_files_and_exit_code(toolchain, tmp_path):
    """A program linked through the corpus wrappers runs on an emulated Cortex-M4 board (``Target.emulator``, the
    emulator CMake and Meson get): picolibc's semihosting start file hands it its arguments (a comma in one too),
    optgym's streams give it our stdin to its end and keep its stdout and stderr apart, it reads a file of this
    machine, 64-bit division, TLS and zeroed data work, and ``main``'s return is the exit code."""
    tail = (*CORTEX_M4.compile_flags, *EMBED, *NO_LTO)
    cc, _ = write_compiler_wrappers(tmp_path / "bin", str(toolchain.clang), str(toolchain.tool("clang++")), "-Oz",
                                    tail, CORTEX_M4.link_flags, CORTEX_M4.program_link_flags)  # fmt: skip
    (tmp_path / "p.c").write_text(PROGRAM)
    (tmp_path / "cat.c").write_text(
        '#include <stdio.h>\nint main(int argc, char **argv) {\n  char line[80];\n  FILE *f = fopen(argv[1], "r");\n'
        '  if (!f || !fgets(line, sizeof line, f)) return 9;\n  printf("%s|%s|%d\\n", line, argv[2], argc);\n'
        "  return 0;\n}\n"
    )
    (tmp_path / "in.txt").write_text("from the host\n")
    (tmp_path / "pipe.c").write_text(
        "#include <stdio.h>\nint main(void) {\n  int c, n = 0;\n  while ((c = getchar()) != EOF) { putchar(c); n++; }\n"
        '  fprintf(stderr, "read %d\\n", n);\n  return 0;\n}\n'
    )
    (tmp_path / "spin.c").write_text("int main(void) { for (;;) { } }\n")
    for name in ("p", "cat", "pipe", "spin"):
        linked = subprocess.run([cc, f"{name}.c", "-o", f"{name}.elf"], cwd=tmp_path, capture_output=True, text=True)
        assert linked.returncode == 0, linked.stderr
    emulator = CORTEX_M4.emulator()
    assert emulator is not None and "mps2-an386" in emulator

    def run(*argv: str, stdin: str = "") -> subprocess.CompletedProcess:
        return subprocess.run([*emulator, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              input=stdin)  # fmt: skip

    alone, two = run("p.elf"), run("p.elf", "a", "b")  # argc 1: 2^40 / 3; argc 3: 3·2^40 / 3
    assert (alone.returncode, alone.stdout) == (2**40 % 3, f"progr {2**40 // 3} 5\n"), alone.stderr
    assert (two.returncode, two.stdout) == (0, f"progr {2**40} 5\n"), two.stderr
    cat = run("cat.elf", "in.txt", "x,y")
    assert (cat.returncode, cat.stdout) == (0, "from the host\n|x,y|3\n"), cat.stderr
    assert run("cat.elf", "missing.txt", "z").returncode == 9
    piped = run("pipe.elf", stdin="two\nlines")  # its stdin is ours, to the end; stdout and stderr stay apart
    assert (piped.returncode, piped.stdout, piped.stderr) == (0, "two\nlines", "read 9\n")
    hung = subprocess.run([*emulator, "--timeout", "2", "spin.elf"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert hung.returncode == 124 and "still ran after 2 s" in hung.stderr  # as timeout(1) says it
    left = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] and "spin.elf" in p.info["cmdline"]]
    assert not left  # the emulator was killed, not left to spin
    spaced = run("cat.elf", "in.txt", "two words")
    assert spaced.returncode == 2 and "spaces" in spaced.stderr
    assert Target("thumbv6m-none-eabi", ("-mcpu=cortex-m0",)).emulator() is None  # no MPS2 board for an M0


def test_other_targets_wrappers_are_untouched(tmp_path):
    """AArch64 Linux and this machine: the wrappers are what they were — ``-fuse-ld=lld`` for a cross link only, and
    no runtime, script or ``-nostdlib``."""
    tail = ("-Xclang", "-fembed-bitcode=all", "-fno-lto")
    a64 = Target("aarch64-linux-gnu")
    assert a64.link_flags == ("-fuse-ld=lld",) and a64.program_link_flags == ()
    cc, _ = write_compiler_wrappers(tmp_path / "a64", "/c/clang", "/c/clang++", "-Oz", (*a64.compile_flags, *tail),
                                    a64.link_flags, a64.program_link_flags)  # fmt: skip
    assert Path(cc).read_text() == (
        "#!/bin/sh\n# optgym corpus build: the requested flags last win; a link also gets the target's\n"
        'case " $* " in *" -c "*|*" -E "*|*" -S "*|*" -M "*|*" -MM "*) exec /c/clang "$@" -Oz '
        "--target=aarch64-linux-gnu -Xclang -fembed-bitcode=all -fno-lto ;; esac\n"
        'exec /c/clang "$@" -Oz --target=aarch64-linux-gnu -Xclang -fembed-bitcode=all -fno-lto -fuse-ld=lld\n'
    )
    cc, _ = write_compiler_wrappers(tmp_path / "host", "/c/clang", "/c/clang++", "-Oz", tail)
    assert Path(cc).read_text() == (
        "#!/bin/sh\n# optgym corpus build: the requested flags last win\n"
        'exec /c/clang "$@" -Oz -Xclang -fembed-bitcode=all -fno-lto\n'
    )


CONFIGURE_AC = """AC_INIT([bm], [1])
AC_PROG_CC
AC_CHECK_FUNCS([malloc snprintf lstat fork])
AC_CONFIG_HEADERS([config.h])
AC_CONFIG_FILES([Makefile])
AC_OUTPUT
"""
MAKEFILE_IN = """srcdir = @srcdir@
VPATH = @srcdir@
CC = @CC@
CFLAGS = @CFLAGS@
prog: prog.o
\t$(CC) $(CFLAGS) -o $@ prog.o
prog.o: prog.c config.h
\t$(CC) $(CFLAGS) -I. -c -o $@ $(srcdir)/prog.c
"""


@needs_picolibc
@pytest.mark.skipif(shutil.which("autoconf") is None or shutil.which("bear") is None, reason="make setup installs them")
def test_an_autoconf_package_for_a_cortex_m_configures_honestly_and_links(toolchain, tmp_path):
    """``optgym corpus build --target thumbv7em-none-eabi`` of an autoconf package: the compiler check passes (it
    failed when nothing linked), the function checks link against picolibc's real ``libc.a`` (``malloc`` and
    ``snprintf`` found, ``lstat`` and ``fork`` not: picolibc has neither), the program links, and it is a module."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "configure.ac").write_text(CONFIGURE_AC)
    (src / "Makefile.in").write_text(MAKEFILE_IN)
    (src / "prog.c").write_text('#include "config.h"\n' + PROGRAM)
    subprocess.run(["autoconf"], cwd=src, check=True, capture_output=True)
    subprocess.run(["autoheader"], cwd=src, check=True, capture_output=True)
    out = tmp_path / "corpus"
    result = build_tree(toolchain, src, out, workers=1, target=CORTEX_M4)
    configure = (out / "logs" / "configure.log").read_text()
    assert "checking whether the C compiler works... yes" in configure
    assert "checking for malloc... yes" in configure and "checking for snprintf... yes" in configure
    assert "checking for lstat... no" in configure and "checking for fork... no" in configure
    assert not result.partial and corpus_info(out, sizes=False)["module_targets"].keys() == {"prog.o"}
    assert any("link against picolibc (thumb/v7e-m/nofp)" in note for note in result.notes)
    prog = result.build_dir / "prog"
    assert _elf_machine(prog) == EM_ARM and "main" in _symbols(toolchain, prog)


@needs_picolibc
def test_cmake_checks_link_programs_only_where_the_compiler_gives_them_their_runtime():
    """A compiler that gives program links their runtime (the corpus build's wrappers, ``optgym compare-build``'s
    link wrappers) lets CMake's checks link programs; without it (or without a runtime) they build a static
    library."""
    static = "-DCMAKE_TRY_COMPILE_TARGET_TYPE=STATIC_LIBRARY"
    assert static in CORTEX_M4.cmake_args() and static not in CORTEX_M4.cmake_args(links_programs=True)
    assert static in Target("riscv32-unknown-elf").cmake_args(links_programs=True)  # no runtime for it


# -- optgym compare-build for a Cortex-M ---------------------------------------------------------------------------

COMPARE_FLAGS = ("--target-flag=-mcpu=cortex-m4", "--target-flag=-mthumb", f"--target-flag=-isystem {PICOLIBC_INCLUDE}")

CMAKE_PROJECT = {
    "CMakeLists.txt": """cmake_minimum_required(VERSION 3.16)
project(tiny C)
include(CheckFunctionExists)
check_function_exists(snprintf HAVE_SNPRINTF)
if(NOT HAVE_SNPRINTF)
  message(FATAL_ERROR "snprintf did not link")
endif()
add_library(util STATIC util.c)
add_executable(prog main.c)
target_link_libraries(prog util)
enable_testing()
add_test(NAME prog_prints_its_sum COMMAND prog)
set_tests_properties(prog_prints_its_sum PROPERTIES PASS_REGULAR_EXPRESSION "sum=139")
""",
    "util.c": """static int clamp(int x, int lo, int hi) { return x < lo ? lo : x > hi ? hi : x; }
static int scale(int x, int k) { return clamp(x * k, -1000, 1000) + clamp(x - k, 0, 50); }
int sum(const int *v, int n) { int s = 0; for (int i = 0; i < n; i++) s += scale(v[i], 3) - clamp(v[i], 0, 9);
  return s; }
""",
    "main.c": """#include <stdio.h>
int sum(const int *, int);
int main(void) { int v[10]; for (int i = 0; i < 10; i++) v[i] = i + 1;
  char line[32]; snprintf(line, sizeof line, "sum=%d", sum(v, 10)); puts(line); return 0; }
""",
}


def test_compare_build_target_flags_reach_both_builds(tmp_path, monkeypatch):
    """``--target-flag`` is split like the corpus build's and every compile and link of both builds gets it:
    CMake's C flags (beside its own COMPILER_TARGET), CFLAGS and LDFLAGS of make and configure, in each
    variant's environment too; a flag without ``--target`` is refused."""
    from typer.testing import CliRunner

    import optgym.evaluate.build_compare as bc
    from optgym.cli import app
    from optgym.errors import OptgymError

    seen = []

    def capture(options, progress):
        seen.append(options)
        raise OptgymError("captured")

    monkeypatch.setattr(bc, "compare_build", capture)
    CliRunner().invoke(app, ["compare-build", str(tmp_path), "--target", "thumbv7em-none-eabi", *COMPARE_FLAGS])
    (opts,) = seen
    flags = ["-mcpu=cortex-m4", "-mthumb", "-isystem", str(PICOLIBC_INCLUDE)]
    assert list(opts.target_flags) == flags and opts.target_spec() == CORTEX_M4
    refused = CliRunner().invoke(app, ["compare-build", str(tmp_path), "--target-flag=-mthumb"])
    assert refused.exit_code != 0 and "needs --target" in refused.output and len(seen) == 1

    opts = bc.CompareOptions(source=tmp_path, outdir=tmp_path / "out", target="thumbv7em-none-eabi",
                             target_flags=tuple(flags))  # fmt: skip
    joined = " ".join(flags)
    assert opts.cflags() == ["-Oz", "--target=thumbv7em-none-eabi", *flags]
    assert opts.ldflags() == ["-fuse-ld=lld", "--target=thumbv7em-none-eabi", *flags]
    for variant in ("plain", "optgym"):
        tools = bc.Tools(f"{variant}-cc", f"{variant}-c++", "ar", "ranlib")
        env = bc.variant_env(opts, variant, tools, None)
        assert env["CFLAGS"] == env["CXXFLAGS"] == f"-Oz --target=thumbv7em-none-eabi {joined}"
        assert env["LDFLAGS"] == f"-fuse-ld=lld --target=thumbv7em-none-eabi {joined}"
        (_, cmake), _ = bc.build_commands("cmake", opts, tools, tmp_path / "b")
        assert f"-DCMAKE_C_FLAGS=-Oz {joined}" in cmake and f"-DCMAKE_CXX_FLAGS=-Oz {joined}" in cmake
        assert "-DCMAKE_C_COMPILER_TARGET=thumbv7em-none-eabi" in cmake and not any("--target=" in a for a in cmake)
        ((_, make),) = bc.build_commands("make", opts, tools, tmp_path)
        assert f"CFLAGS=-Oz --target=thumbv7em-none-eabi {joined}" in make
        assert f"LDFLAGS=-fuse-ld=lld --target=thumbv7em-none-eabi {joined}" in make
        (tmp_path / "configure").write_text("")
        (_, configure), _ = bc.build_commands("autotools", opts, tools, tmp_path)
        assert "--host=arm-none-eabi" in configure
        assert f"CFLAGS=-Oz --target=thumbv7em-none-eabi {joined}" in configure


@needs_picolibc
def test_compare_build_wraps_both_builds_compilers_for_program_links(tmp_path):
    """A Cortex-M target with a runtime: both variants' compilers get the same link wrapper (the corpus build's
    rule), which adds the runtime to program links only; CMake's checks link programs. Another target's
    compilers are left alone."""
    from optgym.evaluate.build_compare import CompareOptions, Tools, build_commands, program_link_wrappers

    tools = {v: Tools(f"/x/{v}-cc", f"/x/{v}-c++", "ar", "ranlib") for v in ("plain", "optgym")}
    opts = CompareOptions(source=tmp_path, outdir=tmp_path / "out", target=CORTEX_M4.triple,
                          target_flags=CORTEX_M4.flags)  # fmt: skip
    wrapped, runtime = program_link_wrappers(opts, tools)
    assert runtime == CORTEX_M4.program_link_flags and str(CORTEX_M_SCRIPT) in runtime
    for variant, real in tools.items():
        for wrapper, compiler in ((wrapped[variant].cc, real.cc), (wrapped[variant].cxx, real.cxx)):
            text = Path(wrapper).read_text()
            assert Path(wrapper).name == Path(compiler).name and text.count(f"exec {compiler} ") == 3
            compile_line, shared_line, program_line = [ln for ln in text.splitlines() if "exec" in ln]
            assert '*" -c "*' in compile_line and compile_line.endswith(f'exec {compiler} "$@" ;; esac')
            assert '*" -shared "*' in shared_line and shared_line.endswith(f'exec {compiler} "$@" ;; esac')
            assert program_line == f'exec {compiler} "$@" {shlex.join(runtime)}'
    (_, cmake), _ = build_commands("cmake", opts, wrapped["plain"], tmp_path / "b")
    assert "-DCMAKE_TRY_COMPILE_TARGET_TYPE=STATIC_LIBRARY" not in cmake
    aarch64 = CompareOptions(source=tmp_path, outdir=tmp_path / "out", target="aarch64-linux-gnu")
    assert program_link_wrappers(aarch64, tools) == (tools, ())


@needs_picolibc
@needs_qemu
@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is installed by `make setup`")
def test_compare_build_links_a_cortex_m_program_in_both_builds(tmp_path):
    """``optgym compare-build --target thumbv7em-none-eabi --test`` with the Cortex-M4 flags: CMake's check links
    snprintf against picolibc, both builds link the program into an ARM ELF that the report compares, and ctest
    runs it on the emulated board (CMake's emulator), where it prints the sum its test expects."""
    import json
    import os
    import sys

    from optgym.toolchain.llvm import find_toolchain

    src = tmp_path / "src"
    for name, text in CMAKE_PROJECT.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "optgym.cli", "compare-build", str(src), "-o", str(out), "--jobs", "2",
               "--target", "thumbv7em-none-eabi", *COMPARE_FLAGS, "--test"]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "OPTGYM_POLICY": "never"})  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["options"]["target_flags"] == list(CORTEX_M4.flags)
    assert report["program_link"]["flags"] == list(CORTEX_M4.program_link_flags)
    (row,) = report["outputs"]
    assert row["path"] == "prog"
    toolchain = find_toolchain()
    for variant in ("plain", "optgym"):
        prog = Path(report["builds"][variant]["tree"]) / "prog"
        assert _elf_machine(prog) == EM_ARM and {"main", "snprintf", "_start"} <= _symbols(toolchain, prog).keys()
        assert row[variant]["text"] > 0 and row[variant]["dottext"] > 0
    markdown = (out / "report.md").read_text()
    assert f"| prog | {row['plain']['text']} | {row['optgym']['text']} |" in markdown
    assert "program links (both" in markdown
    for variant in ("plain", "optgym"):
        tests = report["tests"][variant]
        assert (tests["status"], tests["passed"], tests["failed"]) == ("passed", 1, 0), tests


@needs_picolibc
@needs_qemu
def test_a_cortex_m_thinlto_program_through_optgym_cc_links_and_runs(tmp_path):
    """A firmware-style ThinLTO build for a Cortex-M4 through optgym-cc: the ``-flto=thin`` compiles and the link
    (no ThinLTO plan ships for the target, so it links as clang does) give a program that runs on the emulated
    board, with its cross-module call inlined away or kept, and the right answer either way."""
    import os
    import sys

    cc = str(Path(sys.executable).parent / "optgym-cc")
    (tmp_path / "a.c").write_text("int helper(int x) { return x * 3 + 1; }\n")
    (tmp_path / "b.c").write_text(
        "#include <stdio.h>\nint helper(int);\nint main(int argc, char **argv) {\n"
        '  printf("v=%d\\n", helper(argc + 4));\n  return helper(1) == 4 ? 0 : 1;\n}\n'
    )
    flags = ["--target=thumbv7em-none-eabi", *CORTEX_M4.flags, "-Oz", "-flto=thin"]
    env = {**os.environ, "OPTGYM_STRICT": "1"}  # any fallback would be an error, not a warning
    for name in ("a", "b"):
        compiled = subprocess.run([cc, *flags, "-c", f"{name}.c", "-o", f"{name}.o"], cwd=tmp_path,
                                  capture_output=True, text=True, env=env)  # fmt: skip
        assert compiled.returncode == 0, compiled.stderr
        assert (tmp_path / f"{name}.o").read_bytes()[:4] == b"BC\xc0\xde"  # bitcode, for the link to optimize
    linked = subprocess.run([cc, *flags, *CORTEX_M4.link_flags, *CORTEX_M4.program_link_flags, "a.o", "b.o", "-o",
                             "prog.elf"], cwd=tmp_path, capture_output=True, text=True, env=env)  # fmt: skip
    assert linked.returncode == 0, linked.stderr
    ran = subprocess.run([*CORTEX_M4.emulator(), "prog.elf", "x"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert (ran.returncode, ran.stdout) == (0, "v=19\n"), ran.stderr
