"""``optgym compare-build`` on small real projects (CMake with C, C++, a static and a shared library and a ctest
test; a plain Makefile), built by the real clang-22 and by optgym-cc under ``OPTGYM_POLICY=never`` — a policy
that surely changes the code — with the sizes checked against ``llvm-size`` itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from optgym.evaluate.build_compare import detect_build_system, failing_only_in_optgym, parse_tests, suite_status
from optgym.evaluate.elf_sizes import archive_sizes

LLVM_SIZE = "/usr/lib/llvm-22/bin/llvm-size"

CMAKE_PROJECT = {
    "CMakeLists.txt": """cmake_minimum_required(VERSION 3.16)
project(tiny C CXX)
enable_testing()
add_library(core STATIC lib/stats.c lib/words.cpp)
target_include_directories(core PUBLIC lib)
add_library(shape SHARED lib/shape.c)
add_executable(app main.cpp)
target_link_libraries(app core)
set_source_files_properties(lib/shape.c PROPERTIES COMPILE_OPTIONS -O3)  # a project's own level, after -Oz
add_test(NAME output COMMAND app)
set_tests_properties(output PROPERTIES PASS_REGULAR_EXPRESSION "mean=4 words=3 longest=alpha")
""",
    "lib/core.h": """#ifdef __cplusplus
#include <string>
#include <vector>
std::vector<std::string> split_words(const std::string &text);
std::string longest(const std::vector<std::string> &words);
extern "C" {
#endif
int mean(const int *values, int n);
#ifdef __cplusplus
}
#endif
""",
    "lib/stats.c": """#include "core.h"
static int clamp(int x, int lo, int hi) { return x < lo ? lo : x > hi ? hi : x; }
static int total(const int *v, int n) { int s = 0; for (int i = 0; i < n; i++) s += clamp(v[i], -99, 99); return s; }
int mean(const int *values, int n) { return n ? clamp(total(values, n) / n, -99, 99) : 0; }
""",
    "lib/shape.c": """static double sq(double x) { return x * x; }
double area(double w, double h) { return sq(w) + sq(h) > 0 ? w * h : 0; }
""",
    "lib/words.cpp": """#include "core.h"
#include <algorithm>
#include <sstream>
std::vector<std::string> split_words(const std::string &text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}
std::string longest(const std::vector<std::string> &words) {
  auto it = std::max_element(words.begin(), words.end(),
                             [](const std::string &a, const std::string &b) { return a.size() < b.size(); });
  return it == words.end() ? std::string() : *it;
}
""",
    "main.cpp": """#include "core.h"
#include <iostream>
#include <map>
int main() {
  int v[] = {2, 4, 6};
  auto words = split_words("alpha beta gamma");
  std::map<std::string, int> counts;
  for (const auto &w : words) counts[w]++;
  std::cout << "mean=" << mean(v, 3) << " words=" << counts.size() << " longest=" << longest(words) << "\\n";
  return 0;
}
""",
}

MAKE_PROJECT = {
    # CC/CFLAGS of its own, as many hand-written Makefiles have: compare-build's command-line variables win
    "Makefile": """CC = gcc
CFLAGS = -O2
all: prog
libutil.a: util.o
\t$(AR) rcs $@ $^
prog: main.o libutil.a
\t$(CC) $(CFLAGS) $(LDFLAGS) -o $@ main.o libutil.a
check: prog
\ttest "$$(./prog)" = "sum=55 max=10"
""",
    "util.c": """static int clamp(int x, int lo, int hi) { return x < lo ? lo : x > hi ? hi : x; }
static int scale(int x, int k) { return clamp(x * k, -1000, 1000) + clamp(x - k, 0, 50); }
int sum(const int *v, int n) { int s = 0; for (int i = 0; i < n; i++) s += scale(v[i], 1) - clamp(v[i] - 1, 0, 50);
  return s; }
int max(const int *v, int n) {
  int m = scale(v[0], 1) - clamp(v[0] - 1, 0, 50);
  for (int i = 1; i < n; i++) { int x = scale(v[i], 1) - clamp(v[i] - 1, 0, 50); if (x > m) m = x; }
  return m;
}
""",
    "main.c": """#include <stdio.h>
int sum(const int *, int); int max(const int *, int);
int main(void) { int v[10]; for (int i = 0; i < 10; i++) v[i] = i + 1;
  printf("sum=%d max=%d\\n", sum(v, 10), max(v, 10)); return 0; }
""",
}


def write_project(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def compare_build(src: Path, out: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, dict]:
    """The command as a user runs it, with ``OPTGYM_POLICY=never`` in the environment it passes on."""
    command = [sys.executable, "-m", "optgym.cli", "compare-build", str(src), "-o", str(out), "--jobs", "2", *args]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "OPTGYM_POLICY": "never", **env})  # fmt: skip
    report_file = out / "report.json"
    assert report_file.exists(), proc.stderr
    return proc, json.loads(report_file.read_text())


def llvm_size(path: Path) -> tuple[int, int, int]:
    """Berkeley text and data (each summed over an archive's members) and the ``.text*`` total, from ``llvm-size``
    itself."""
    berkeley = subprocess.run([LLVM_SIZE, str(path)], capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in berkeley.splitlines()[1:] if line.strip()]
    text, data = sum(int(r[0]) for r in rows), sum(int(r[1]) for r in rows)
    sysv = subprocess.run([LLVM_SIZE, "-A", str(path)], capture_output=True, text=True, check=True).stdout
    dottext = sum(int(line.split()[1]) for line in sysv.splitlines() if line.startswith(".text"))
    return text, data, dottext


def check_sizes(report: dict, rows: str) -> None:
    """Every figure of ``report[rows]`` is what llvm-size and the file system say about that file."""
    for row in report[rows]:
        for variant in ("plain", "optgym"):
            path = Path(report["builds"][variant]["tree"]) / row["path"]
            figures = row[variant]
            assert (figures["text"], figures["data"], figures["dottext"]) == llvm_size(path), (variant, row["path"])
            assert figures["file"] == path.stat().st_size


def check_report_files(proc: subprocess.CompletedProcess, report: dict, out: Path) -> None:
    """report.md is what was printed, says these are LINKED sizes, and shows report.json's figures."""
    markdown = (out / "report.md").read_text()
    assert proc.stdout.strip() == markdown.strip()
    assert "LINKED sizes" in markdown
    for row in report["outputs"]:
        cells = [str(row[v][f]) for f in ("text", "data", "dottext", "file") for v in ("plain", "optgym")]
        line = next(line for line in markdown.splitlines() if line.startswith(f"| {row['path']} |"))
        assert [c.strip() for c in line.split("|")[2:-1:3]] == cells[0::2]  # plain columns
        assert [c.strip() for c in line.split("|")[3:-1:3]] == cells[1::2]  # optgym columns
    totals = report["totals"]
    assert f"**{totals['plain']['text']}** | **{totals['optgym']['text']}** | **{totals['ratio']['text']:.4f}**" in (
        markdown
    )
    for step in report["builds"]["plain"]["steps"]:
        assert f"| {step['name']} | {step['wall_s']} |" in markdown


def check_tests_passed(report: dict, markdown: str) -> None:
    for variant in ("plain", "optgym"):
        tests = report["tests"][variant]
        assert tests["status"] == "passed" and tests["returncode"] == 0, (variant, tests)
    assert report["tests"]["fail_only_in_optgym"] == []
    assert "No test fails only in the optgym build." in markdown


@pytest.fixture(scope="module")
def cmake_run(tmp_path_factory):
    src = write_project(tmp_path_factory.mktemp("cmake-src"), CMAKE_PROJECT)
    out = tmp_path_factory.mktemp("cmake-out")
    proc, report = compare_build(src, out, "--test")
    return src, out, proc, report


def test_cmake_project_outputs_paired_and_sized(cmake_run):
    _, out, proc, report = cmake_run
    assert proc.returncode == 0, proc.stderr
    assert report["build_system"] == "cmake" and report["problems"] == []
    assert [r["path"] for r in report["outputs"]] == ["app", "libshape.so"]  # no CMakeFiles/ compiler-id a.out
    assert report["only_in_plain"] == report["only_in_optgym"] == []
    assert [r["path"] for r in report["archives"]] == ["libcore.a"]
    check_sizes(report, "outputs")
    check_sizes(report, "archives")
    app = report["outputs"][0]
    assert app["optgym"]["text"] != app["plain"]["text"], "OPTGYM_POLICY=never inlines nothing: the code changes"
    assert app["identical"] is False
    totals = report["totals"]
    assert totals["paired"] == 2
    assert totals["plain"]["text"] == sum(r["plain"]["text"] for r in report["outputs"])
    assert totals["ratio"]["text"] == totals["optgym"]["text"] / totals["plain"]["text"]
    assert report["compilers"]["plain"]["cc"] == "/usr/lib/llvm-22/bin/clang"
    assert report["compilers"]["optgym"]["cxx"] == str(Path(sys.executable).parent / "optgym-c++")
    assert report["compilers"]["optgym"]["ar"] == "/usr/lib/llvm-22/bin/llvm-ar"
    assert report["optgym_environment"]["OPTGYM_POLICY"] == "never"
    assert report["optgym_environment"]["OPTGYM_STRICT"] == "1"
    assert report["builds"]["optgym"]["fallback_warnings"] == 0
    # shape.c's own -O3 comes after the -Oz given: clang's compile in both builds, and the report says so
    assert report["compiles"] == {"listed": 4, "served": 3, "levels": {"-O3": 1, "-Oz": 3}}
    assert "3 of 4 compiles ran at a level optgym-cc serves (by the last -O of each: -O3 1, -Oz 3)" in (
        (out / "report.md").read_text()
    )
    # the build directories' paths are of one length: a path a build embeds in its outputs (a RUNPATH, __FILE__)
    # weighs the same in both
    trees = [report["builds"][variant]["tree"] for variant in ("plain", "optgym")]
    assert trees[0] != trees[1] and len(trees[0]) == len(trees[1]), trees


def test_cmake_project_timed_with_the_policy_server(cmake_run):
    """The optgym build's CPU seconds include the policy server and the compiles it ran (reaped, not left
    running): counted by the build's children alone they were a fifth of plain clang's."""
    _, _, _, report = cmake_run
    steps = {v: {s["name"]: s for s in report["builds"][v]["steps"]} for v in ("plain", "optgym")}
    for variant in ("plain", "optgym"):
        assert [s["lingering"] for s in steps[variant].values()] == [[], []]
        assert steps[variant]["build"]["wall_s"] > 0 and steps[variant]["build"]["cpu_s"] > 0
    plain, optgym = steps["plain"]["build"]["cpu_s"], steps["optgym"]["build"]["cpu_s"]
    assert optgym > 0.7 * plain
    # the server's own share (read before it is stopped): part of the build's, and only the optgym build has one
    assert [s["server_cpu_s"] for s in steps["plain"].values()] == [0.0, 0.0]
    assert 0 < steps["optgym"]["build"]["server_cpu_s"] < optgym
    assert report["build_ratio"]["cpu"] == round(optgym / plain, 4)


def test_cmake_project_tests_pass_in_both_and_the_reports_agree(cmake_run):
    _, out, proc, report = cmake_run
    assert report["tests"]["plain"]["passed"] == report["tests"]["optgym"]["passed"] == 1
    assert report["tests"]["plain"]["failed"] == report["tests"]["optgym"]["failed"] == 0
    check_tests_passed(report, (out / "report.md").read_text())
    check_report_files(proc, report, out)


def test_cmake_thinlto_links_the_bitcode_static_library(tmp_path):
    """``--lto thin``: the static library holds LLVM-22 bitcode (archived by LLVM-22's llvm-ar, which the command
    hands the build) and clang's own ThinLTO link through lld reads it, in both builds."""
    src = write_project(tmp_path / "src", CMAKE_PROJECT)
    proc, report = compare_build(src, tmp_path / "out", "--lto", "thin", "--test", OPTGYM_LTO_POLICY="heuristic")
    assert proc.returncode == 0, proc.stderr
    assert report["flags"] == {"cflags": ["-Oz", "-flto=thin"], "ldflags": ["-fuse-ld=lld", "-flto=thin"]}
    assert [r["path"] for r in report["outputs"]] == ["app", "libshape.so"]
    check_sizes(report, "outputs")
    identical = [r["path"] for r in report["outputs"] if r["identical"]]
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert (f"{len(identical)} of 2 outputs are byte-identical" in markdown) == bool(identical)
    (archive,) = report["archives"]
    for variant in ("plain", "optgym"):
        assert archive[variant]["bitcode_members"] == 2 and archive[variant]["text"] == 0
    check_tests_passed(report, (tmp_path / "out" / "report.md").read_text())
    check_report_files(proc, report, tmp_path / "out")


AUTOMAKE_PROJECT = {
    "configure.ac": "AC_INIT([checked], [1.0])\nAM_INIT_AUTOMAKE([foreign])\nAC_PROG_CC\n"
    "AC_CONFIG_FILES([Makefile])\nAC_OUTPUT\n",
    "Makefile.am": "bin_PROGRAMS = tool\ntool_SOURCES = tool.c\ncheck_PROGRAMS = t_sum\nt_sum_SOURCES = t_sum.c\n"
    "TESTS = t_sum t_script.sh\nEXTRA_DIST = t_script.sh\n",
    "tool.c": '#include <stdio.h>\nint main(int argc, char **argv) { printf("%d\\n", argc); return 0; }\n',
    "t_sum.c": "int main(void) { volatile int s = 0; for (int i = 1; i <= 10; i++) s += i; return s == 55 ? 0 : 1; }\n",
    "t_script.sh": "#!/bin/sh\nexit 0\n",
}


@pytest.mark.skipif(any(shutil.which(t) is None for t in ("autoreconf", "qemu-aarch64")),
                    reason="autoconf, automake and qemu-user are installed by `make setup`")  # fmt: skip
def test_an_automake_suite_of_a_cross_build_runs_its_programs_under_the_emulator(tmp_path):
    """``make check`` of an AArch64 autotools build: the test program runs under qemu-user (the harness's
    ``LOG_COMPILER`` is compare-build's runner, which leaves a test script to run as it is), so both builds' suites
    pass where the program could not start before."""
    src = write_project(tmp_path / "src", AUTOMAKE_PROJECT)
    (src / "t_script.sh").chmod(0o755)
    proc, report = compare_build(src, tmp_path / "out", "--target", "aarch64-linux-gnu", "--test")
    assert proc.returncode == 0, proc.stderr
    runner = tmp_path / "out" / "wrappers" / "run-test"
    assert "qemu-aarch64" in runner.read_text()
    for variant in ("plain", "optgym"):
        tests = report["tests"][variant]
        assert (tests["status"], tests["passed"], tests["failed"]) == ("passed", 2, 0), tests
        assert f"LOG_COMPILER={runner}" in tests["command"]


def test_plain_makefile_project(tmp_path):
    """A hand-written Makefile is built in a copy of the tree per variant, with the compilers and flags given
    on make's command line (the Makefile's own ``CC = gcc`` loses); ``make check`` runs its test."""
    src = write_project(tmp_path / "src", MAKE_PROJECT)
    (tmp_path / "src" / "stale.o").write_bytes(b"\x7fELF" + bytes(60))  # an earlier in-tree build's leftover
    before = sorted(p.name for p in src.iterdir())
    proc, report = compare_build(src, tmp_path / "out", "--test")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in src.iterdir()) == before, "the source tree is left untouched"
    assert report["build_system"] == "make"
    assert report["builds"]["plain"]["build_outputs_not_copied"] == 1
    assert [r["path"] for r in report["outputs"]] == ["prog"] and [r["path"] for r in report["archives"]] == [
        "libutil.a"
    ]
    check_sizes(report, "outputs")
    check_sizes(report, "archives")
    assert report["archives"][0]["optgym"]["text"] != report["archives"][0]["plain"]["text"]
    assert "clang version 22" in subprocess.run(
        ["/usr/lib/llvm-22/bin/llvm-readelf", "-p", ".comment", str(Path(report["builds"]["plain"]["tree"]) / "prog")],
        capture_output=True, text=True,
    ).stdout  # fmt: skip
    check_tests_passed(report, (tmp_path / "out" / "report.md").read_text())
    check_report_files(proc, report, tmp_path / "out")


def test_archive_sizes_regular_thin_and_bitcode(tmp_path):
    """An archive's figures are its members' (a long member name, a thin archive as meson writes them); LTO
    bitcode members are counted apart, with no size."""
    llvm = "/usr/lib/llvm-22/bin"
    (tmp_path / "a_member_name_longer_than_sixteen.c").write_text(
        'int f(int x) { return 3 * x; }\nconst char *s = "hi";\n'
    )
    (tmp_path / "b.c").write_text("int g(int x) { return x + 1; }\n")
    objects = ["a_member_name_longer_than_sixteen.o", "b.o"]
    subprocess.run([f"{llvm}/clang", "-Oz", "-c", *(o[:-1] + "c" for o in objects)], cwd=tmp_path, check=True)
    subprocess.run([f"{llvm}/clang", "-Oz", "-flto=thin", "-c", "b.c", "-o", "bc.o"], cwd=tmp_path, check=True)
    for archive, flags, members in (
        ("libx.a", "rcs", objects),
        ("libt.a", "rcsT", objects),
        ("liby.a", "rcs", ["bc.o"]),
    ):
        subprocess.run([f"{llvm}/llvm-ar", flags, archive, *members], cwd=tmp_path, check=True)
    for archive in ("libx.a", "libt.a"):
        sizes = archive_sizes(tmp_path / archive)
        assert (sizes.text_bytes, sizes.data_bytes, sizes.dottext_bytes) == llvm_size(tmp_path / archive)
        assert sizes.elf_members == 2
    assert (
        archive_sizes(tmp_path / "liby.a").bitcode_members == 1 and archive_sizes(tmp_path / "liby.a").text_bytes == 0
    )


def test_build_system_detection(tmp_path):
    for marker, system in (("CMakeLists.txt", "cmake"), ("meson.build", "meson"), ("configure.ac", "autotools"),
                           ("autogen.sh", "autotools"), ("Makefile", "make")):  # fmt: skip
        project = tmp_path / marker
        project.mkdir()
        (project / marker).write_text("")
        (project / "Makefile.in").write_text("")
        assert detect_build_system(project) == system
    (tmp_path / "both").mkdir()
    for marker in ("CMakeLists.txt", "configure", "Makefile"):
        (tmp_path / "both" / marker).write_text("")
    assert detect_build_system(tmp_path / "both") == "cmake"


CTEST_FAILED = """Test project /b
1/2 Test #1: one ..........   Passed    0.01 sec
2/2 Test #2: two ..........***Failed    0.01 sec

50% tests passed, 1 tests failed out of 2

The following tests FAILED:
\t  2 - two (Failed)
Errors while running CTest
"""
AUTOMAKE = """PASS: t1.sh
FAIL: t2.sh
============================================================================
# TOTAL: 3
# PASS:  1
# SKIP:  1
# XFAIL: 0
# FAIL:  1
# XPASS: 0
# ERROR: 0
"""
MESON = """1/2 a   OK      0.01s
2/2 b   FAIL    0.01s   exit status 1

Ok:                 1
Expected Fail:      0
Fail:               1
Unexpected Pass:    0
Skipped:            0
Timeout:            0
"""


def test_parse_test_results():
    assert parse_tests("cmake", CTEST_FAILED) == {"passed": 1, "failed": 1, "failed_names": ["two"]}
    assert parse_tests("autotools", AUTOMAKE) == {"passed": 1, "failed": 1, "failed_names": ["t2.sh"]}
    assert parse_tests("meson", MESON) == {"passed": 1, "failed": 1, "failed_names": ["b"]}
    assert parse_tests("make", "ok\n") == {"passed": None, "failed": None, "failed_names": None}


def test_a_suite_that_ran_no_test_is_not_called_passed():
    """Each harness exits 0 when a project defines no test (meson's and ctest's words, as gvfs and gl2ps print
    them): the report says "no tests", so a build without a suite is never counted as one whose tests pass."""
    for system, output in (("meson", "ninja: no work to do.\nNo tests defined.\n"),
                           ("cmake", "Test project /b\nNo tests were found!!!\n")):  # fmt: skip
        counts = parse_tests(system, output)
        assert counts == {"passed": 0, "failed": 0, "failed_names": []}
        assert suite_status(0, counts) == "no tests"
    all_ok = MESON.replace("Fail:               1", "Fail:               0")
    assert suite_status(0, parse_tests("meson", all_ok)) == "passed"
    assert suite_status(1, parse_tests("meson", MESON)) == "failed"
    assert suite_status(0, parse_tests("make", "ok\n")) == "passed"  # a hand-written suite: its exit status


def test_a_test_failing_only_in_optgym_is_flagged():
    plain = {"returncode": 8, "passed": 1, "failed": 1, "failed_names": ["two"]}
    assert failing_only_in_optgym(plain, {**plain, "failed": 2, "failed_names": ["one", "two"]}) == ["one"]
    assert failing_only_in_optgym(plain, plain) == []
    unnamed = {"returncode": 0, "passed": None, "failed": None, "failed_names": None}
    assert failing_only_in_optgym(unnamed, {**unnamed, "returncode": 2}) == ["the test suite (exit status 2; plain: 0)"]


def test_a_default_builds_report_names_its_shipped_files_and_records_as_the_inliners_linked_figure(
    cmake_run, tmp_path, monkeypatch
):
    """A build serving ``pretrained`` records the hash of every shipped policy file, so ``ship_pretrained --linked``
    can tie its linked figures to the inliner shipped now, and refuses a build of another policy, of another file,
    or of a package the inliner trained on."""
    from maintainer import ship_pretrained
    from optgym.policies import PRETRAINED_DIR, file_identity, pretrained_provenance

    src, never_out, _, _ = cmake_run
    out = tmp_path / "default"
    proc, report = compare_build(src, out, "--test", OPTGYM_POLICY="pretrained")
    assert proc.returncode == 0, proc.stderr
    shipped = report["shipped_policies"]
    assert shipped["inline-size.onnx"] == file_identity(PRETRAINED_DIR / "inline-size.onnx")
    assert "portfolio-c.json" in shipped and not any(name.endswith(".provenance.json") for name in shipped)
    shipped_copy = tmp_path / "pretrained" / "inline-size.onnx"
    shipped_copy.parent.mkdir()
    copy = shipped_copy.with_suffix(".provenance.json")
    shutil.copy(PRETRAINED_DIR / "inline-size.onnx", shipped_copy)
    shutil.copy(pretrained_provenance("inline-size"), copy)
    monkeypatch.setattr(ship_pretrained.optgym_cc, "PRETRAINED_DIR", str(shipped_copy.parent))
    provenance_path, entry = ship_pretrained.linked_figures(out)
    assert provenance_path == copy and entry["target"] is None
    assert entry["package"] == src.name and entry["side"] == "unseen"
    assert entry["tests"] == {"plain": "passed", "optgym": "passed"}
    assert (entry["plain"], entry["optgym"]) == (report["totals"]["plain"], report["totals"]["optgym"])
    before = json.loads(copy.read_text())["figures"].get(ship_pretrained.LINKED, [])
    for _ in range(2):  # recorded again: replaced, not added; other packages' entries kept
        ship_pretrained.record([entry], ship_pretrained.LINKED, [copy], by="package")
    assert json.loads(copy.read_text())["figures"][ship_pretrained.LINKED] == [*before, entry]
    with pytest.raises(SystemExit, match="served OPTGYM_POLICY=never"):
        ship_pretrained.linked_figures(never_out)
    provenance = json.loads(copy.read_text())
    copy.write_text(json.dumps({**provenance, "sha256": "0" * 64}))
    with pytest.raises(SystemExit, match=r"another inline-size\.onnx"):
        ship_pretrained.linked_figures(out)
    copy.write_text(json.dumps({**provenance, "training_packages": {src.name: "1.0"}}))
    with pytest.raises(SystemExit, match="on the inliner's training list"):
        ship_pretrained.linked_figures(out)


def test_a_cross_builds_linked_figures_go_to_its_targets_inliner(tmp_path):
    """An AArch64 build served by default (tests under qemu-user) records as a linked figure of the inliner shipped
    for AArch64, in that file's provenance, tied to that file by the report's hash."""
    from maintainer import ship_pretrained
    from optgym.policies import PRETRAINED_DIR

    shipped = PRETRAINED_DIR / "aarch64" / "inline-size.onnx"
    if not shipped.is_file() or shutil.which("qemu-aarch64") is None:
        pytest.skip("needs the AArch64 inliner and qemu-user (make setup)")
    src = write_project(tmp_path / "src", CMAKE_PROJECT)
    out = tmp_path / "out"
    proc, report = compare_build(src, out, "--target", "aarch64-linux-gnu", "--test", OPTGYM_POLICY="pretrained")
    assert proc.returncode == 0, proc.stderr
    provenance_path, entry = ship_pretrained.linked_figures(out)
    assert provenance_path == shipped.with_suffix(".provenance.json")
    assert entry["target"] == "aarch64-linux-gnu" and entry["tests"] == {"plain": "passed", "optgym": "passed"}
    assert report["shipped_policies"]["aarch64/inline-size.onnx"] == json.loads(provenance_path.read_text())["sha256"]
