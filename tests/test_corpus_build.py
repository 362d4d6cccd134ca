"""Corpora from real builds: a CMake and a Make project written here, built by the real clang-22.

The reproduction check is the one that matters for training: a module compiled from the corpus
(its bitcode and its ``-cc1`` command) must give the same code as the object the original build
produced, or the heuristic baseline and every reward would be measured on different code.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from optgym.corpus import Corpus
from optgym.corpus.build import build_tree, detect_build_systems
from optgym.corpus.extract import extract
from optgym.corpus.info import corpus_info
from optgym.errors import CorpusError
from optgym.problems import get_problem
from optgym.rollout import plain_compile
from optgym.toolchain import object_sizes

LIB_C = r"""
#include "lib.h"
static int clamp(int x, int lo, int hi) { return x < lo ? lo : x > hi ? hi : x; }
static int mix(int a, int b) { return clamp(a * 31 + b, -1000, 1000); }
int checksum(const int *v, int n) {
  int h = 7;
  for (int i = 0; i < n; i++) h = mix(h, v[i]);
  return h;
}
"""
LIB_H = '#ifdef __cplusplus\nextern "C" {\n#endif\nint checksum(const int *v, int n);\n#ifdef __cplusplus\n}\n#endif\n'
SHAPES_CPP = r"""
#include <memory>
#include <numeric>
#include <vector>
#include "lib.h"
struct Shape { virtual ~Shape() = default; virtual int area() const = 0; };
struct Square : Shape { int s; explicit Square(int s) : s(s) {} int area() const override { return s * s; } };
struct Rect : Shape { int w, h; Rect(int w, int h) : w(w), h(h) {} int area() const override { return w * h; } };
extern "C" int total(int n) {
  std::vector<std::unique_ptr<Shape>> shapes;
  for (int i = 0; i < n; ++i) {
    if (i % 2) shapes.push_back(std::make_unique<Square>(i)); else shapes.push_back(std::make_unique<Rect>(i, i + 1));
  }
  std::vector<int> areas;
  for (const auto &s : shapes) areas.push_back(s->area());
  return std::accumulate(areas.begin(), areas.end(), checksum(areas.data(), (int)areas.size()));
}
"""
MAIN_C = r"""
#include <stdio.h>
int total(int n);
int main(void) { printf("%d\n", total(10)); return 0; }
"""

CMAKE_LISTS = """
cmake_minimum_required(VERSION 3.13)
project(shapes C CXX)
add_library(shapes STATIC lib.c shapes.cpp)
add_executable(app main.c)
target_link_libraries(app shapes)
"""
# A hand-written Makefile that forces its own -O2 (over the environment's CFLAGS, and after them for shapes.o).
MAKEFILE = """\
CFLAGS = -O2 -Wall
OBJS = lib.o shapes.o main.o
app: $(OBJS)
\t$(CXX) -o $@ $(OBJS)
shapes.o: shapes.cpp lib.h
\t$(CXX) $(CXXFLAGS) -O2 -c shapes.cpp -o shapes.o
"""


def _write_project(root: Path, build_file: str, text: str) -> Path:
    root.mkdir(parents=True)
    for name, body in {"lib.c": LIB_C, "lib.h": LIB_H, "shapes.cpp": SHAPES_CPP, "main.c": MAIN_C,
                       build_file: text}.items():  # fmt: skip
        (root / name).write_text(body)
    return root


@pytest.fixture(scope="module")
def cmake_corpus(toolchain, tmp_path_factory):
    root = tmp_path_factory.mktemp("cmake")
    src = _write_project(root / "src", "CMakeLists.txt", CMAKE_LISTS)
    result = build_tree(toolchain, src, root / "corpus", opt="-Oz", workers=2)
    return result, Corpus(root / "corpus")


@pytest.fixture(scope="module")
def make_corpus(toolchain, tmp_path_factory):
    if not shutil.which("bear"):
        pytest.skip("bear is not installed (apt-get install bear): plain-Make builds need it")
    root = tmp_path_factory.mktemp("make")
    src = _write_project(root / "src", "Makefile", MAKEFILE)
    result = build_tree(toolchain, src, root / "corpus", opt="-Oz", workers=2)
    return result, Corpus(root / "corpus")


def _same_text_as_build(toolchain, corpus: Corpus, build_dir: Path) -> None:
    problem = get_problem("inline-size")
    for module in corpus:
        original = build_dir / module.name  # module names are object paths relative to the build tree
        assert original.is_file(), original
        result = plain_compile(problem, module, toolchain)
        assert result.ok, result
        sizes = object_sizes(original)
        assert result.metrics["dottext_bytes"] == sizes.dottext_bytes, module.name
        assert result.metrics["text_bytes"] == sizes.text_bytes, module.name  # .llvmbc/.llvmcmd are not allocated
        assert result.metrics["dottext_bytes"] > 0


def test_cmake_project_becomes_a_corpus(cmake_corpus):
    result, corpus = cmake_corpus
    assert result.build_system == "cmake"
    assert sorted(m.name for m in corpus) == [
        "CMakeFiles/app.dir/main.c.o",
        "CMakeFiles/shapes.dir/lib.c.o",
        "CMakeFiles/shapes.dir/shapes.cpp.o",
    ]
    prov = corpus.description["optgym"]["provenance"]
    assert prov["build_system"] == "cmake" and prov["opt"] == "-Oz" and not prov["partial"]
    assert "mlgo-utils 19.0.0.dev202407180600" in prov["tool"]
    for step in ("configure", "build", "extract"):
        assert (corpus.root / "logs" / f"{step}.log").is_file()
    info = corpus_info(corpus.root, sizes=False)
    assert info["languages"] == {"C": 2, "C++": 1}
    assert info["opt_levels"] == {"-Oz": 3}


def test_cmake_module_reproduces_the_built_object(toolchain, cmake_corpus):
    result, corpus = cmake_corpus
    _same_text_as_build(toolchain, corpus, result.build_dir)


def test_make_project_becomes_a_corpus_and_reproduces_objects(toolchain, make_corpus):
    result, corpus = make_corpus
    assert result.build_system == "make"
    assert sorted(m.name for m in corpus) == ["lib.o", "main.o", "shapes.o"]
    _same_text_as_build(toolchain, corpus, result.build_dir)
    # the Makefile's -O2 came before the compiler wrapper's -Oz, which wins
    assert corpus_info(corpus.root, sizes=False)["opt_levels"] == {"-Oz": 3}
    assert result.extract.opt_mismatches == {"modules": 0, "levels": {}, "examples": {}}
    assert result.extract.opt_warning() is None


def test_modules_at_another_opt_level_are_reported(toolchain, make_corpus, tmp_path):
    """A build asked for one level whose modules came out at another: extract warns, corpus info reports them."""
    result, _ = make_corpus
    report = extract(toolchain, result.compdb, tmp_path / "c", opt="-O2")  # as if -O2 had been asked for
    assert report.opt_mismatches == {"modules": 3, "levels": {"-Oz": 3},
                                     "examples": {"lib.o": "-Oz", "main.o": "-Oz", "shapes.o": "-Oz"}}  # fmt: skip
    assert report.opt_warning().startswith("3 of 3 modules were compiled at another -O level than the requested -O2")
    info = corpus_info(tmp_path / "c", sizes=False)
    assert info["requested_opt"] == ["-O2"] and info["opt_mismatches"] == report.opt_mismatches
    proc = subprocess.run([sys.executable, "-m", "optgym.cli", "corpus", "info", str(tmp_path / "c"), "--no-sizes"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "warning 3 of 3 modules were compiled at another -O level" in " ".join(proc.stdout.split())


def test_rebuild_is_incremental_and_keeps_the_corpus(toolchain, cmake_corpus):
    _, corpus = cmake_corpus
    src = Path(corpus.description["optgym"]["provenance"]["source_dir"])
    again = build_tree(toolchain, src, corpus.root, opt="-Oz", workers=2)
    assert "no work to do" in (corpus.root / "logs" / "build.log").read_text()
    assert again.extract.modules == [m.name for m in corpus]
    assert not list(corpus.root.parent.glob(".corpus.*")), "a staging directory was left behind"


def test_failing_configure_names_the_step_and_its_log(toolchain, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.13)\nproject(x C)\nmessage(FATAL_ERROR boom)\n"
    )
    with pytest.raises(CorpusError) as info:
        build_tree(toolchain, src, tmp_path / "corpus", build_system="cmake")
    log = tmp_path / "corpus" / "logs" / "configure.log"
    assert "'configure'" in str(info.value) and str(log) in str(info.value)
    assert "boom" in log.read_text()
    assert not (tmp_path / "corpus" / "corpus_description.json").exists()


def test_detects_build_systems(tmp_path):
    (tmp_path / "configure.ac").write_text("")
    (tmp_path / "Makefile").write_text("")
    assert detect_build_systems(tmp_path) == ["autotools", "make"]
    (tmp_path / "CMakeLists.txt").write_text("")
    assert detect_build_systems(tmp_path)[0] == "cmake"


def test_extract_skips_links_and_multi_cc1_objects(toolchain, tmp_path):
    """A link over bitcode-embedded objects concatenates their sections: several -cc1, not a module."""
    clang = str(toolchain.clang)
    (tmp_path / "a.c").write_text("int a(int x) { return x + 1; }\n")
    (tmp_path / "b.c").write_text("int b(int x) { return x * 2; }\n")
    for name in ("a", "b"):
        subprocess.run([clang, "-Oz", "-Xclang", "-fembed-bitcode=all", "-c", f"{name}.c", "-o", f"{name}.o"],
                       cwd=tmp_path, check=True)  # fmt: skip
    subprocess.run([clang, "-r", "a.o", "b.o", "-o", "ab.o"], cwd=tmp_path, check=True)
    database = [
        {"directory": str(tmp_path), "file": "a.c", "command": f"{clang} -Oz -c a.c -o a.o"},
        {"directory": str(tmp_path), "file": "b.c", "arguments": [clang, "-Oz", "-c", "b.c", "-o", "b.o"]},
        {"directory": str(tmp_path), "file": "ab.c", "arguments": [clang, "-c", "ab.c", "-o", "ab.o"]},
        {"directory": str(tmp_path), "file": "a.o", "arguments": [clang, "a.o", "b.o", "-o", "prog"]},
        {"directory": str(tmp_path), "file": "s.S", "arguments": [clang, "-c", "s.S", "-o", "s.o"]},
        {"directory": str(tmp_path), "file": "gone.c", "arguments": [clang, "-c", "gone.c", "-o", "gone.o"]},
    ]
    (tmp_path / "compile_commands.json").write_text(json.dumps(database))
    report = extract(toolchain, tmp_path / "compile_commands.json", tmp_path / "corpus")
    assert report.modules == ["a.o", "b.o"]
    reasons = dict(report.skipped)
    assert reasons["ab.o"].startswith("2 -cc1 commands")
    assert any(r.startswith("not a single-TU compile") for r in reasons.values())
    assert any(r.startswith("assembly") for r in reasons.values())
    assert any(r.startswith("object missing") for r in reasons.values())
    assert len(Corpus(tmp_path / "corpus")) == 2


def test_cli_build_and_info_json(cmake_corpus, tmp_path):
    _, corpus = cmake_corpus
    src = corpus.description["optgym"]["provenance"]["source_dir"]
    out = tmp_path / "c"
    proc = subprocess.run([sys.executable, "-m", "optgym.cli", "corpus", "build", src, "-o", str(out), "-j", "2",
                           "--exclude", "*main*"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "2 modules" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "optgym.cli", "corpus", "info", str(out), "--json", "-j", "2"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["modules"] == 2 and info["languages"] == {"C": 1, "C++": 1}
    assert info["heuristic"]["failed"] == 0 and info["heuristic"]["text_bytes"] > info["heuristic"]["dottext_bytes"]


MESON_BUILD = "project('shapes', 'c', 'cpp')\nexecutable('app', 'lib.c', 'shapes.cpp', 'main.c')\n"


def test_meson_project_becomes_a_corpus(toolchain, tmp_path):
    if not shutil.which("meson"):
        pytest.skip("meson is not installed (apt-get install meson)")
    src = _write_project(tmp_path / "src", "meson.build", MESON_BUILD)
    result = build_tree(toolchain, src, tmp_path / "corpus", workers=2)
    assert result.build_system == "meson" and not result.partial
    corpus = Corpus(tmp_path / "corpus")
    assert len(corpus) == 3
    _same_text_as_build(toolchain, corpus, result.build_dir)


def test_a_build_systems_compiler_probes_are_not_modules(tmp_path):
    """CMake's compiler identification (which compiles with -c when CMake may not link, as on bare metal) and
    try-compiles, and Meson's sanity checks, compile in directories of their own: not the program's code. The
    program's objects under ``CMakeFiles/X.dir/`` compile in the build directory and are kept."""
    from optgym.corpus.extract import classify

    build = tmp_path / "build"
    probes = [build / "CMakeFiles/3.25.1/CompilerIdC", build / "CMakeFiles/CMakeScratch/TryCompile-x",
              build / "meson-private/tmpabc"]  # fmt: skip
    for directory in probes:
        entry = {"directory": str(directory), "arguments": ["clang", "-c", "probe.c", "-o", "probe.o"]}
        assert classify(entry) == "a build system's probe of the compiler"
    kept = classify(
        {"directory": str(build), "arguments": ["clang", "-c", "../src/a.c", "-o", "CMakeFiles/x.dir/a.c.o"]}
    )
    assert not isinstance(kept, str) and kept.output == build / "CMakeFiles/x.dir/a.c.o"
