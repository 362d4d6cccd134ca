"""``optgym corpus thinlto``: corpora of distributed-ThinLTO backends, from a real -flto=thin build's objects
and from a per-TU corpus's packages; each module is the backend compile, byte for byte."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from optgym.corpus import Corpus, Module
from optgym.corpus.embedded import corpus_from_sources
from optgym.corpus.portable import portable_modules
from optgym.corpus.thinlto import Program, Symbols, package_programs, static_link
from optgym.policies import resolve_policy
from optgym.problems import get_problem
from optgym.problems.inline_size import FEATURES
from optgym.rollout import rollout
from optgym_cc.thinlto import PLAN_FORMAT

OPTGYM = [sys.executable, "-m", "optgym.cli", "corpus", "thinlto"]
LIB = "int scale(int x) { return 3 * x + 1; }\nint twice(int x) { return 2 * scale(x); }\n"
MAIN = "int twice(int);\nint main(int argc, char **argv) { return twice(argc) + twice(argc + 1); }\n"


def test_each_module_compiles_to_its_thinlto_backend_and_its_imports_are_decisions(toolchain, tmp_path):
    clang = str(toolchain.clang)
    for name, source in (("lib", LIB), ("main", MAIN)):
        (tmp_path / f"{name}.c").write_text(source)
        subprocess.run([clang, "-Oz", "-flto=thin", "-c", f"{name}.c", "-o", f"{name}.o"], cwd=tmp_path, check=True)
    corpus_dir = tmp_path / "corpus"
    result = subprocess.run([*OPTGYM, "lib.o", "main.o", "-o", str(corpus_dir)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0 and "2 ThinLTO backends" in result.stdout, result.stderr
    corpus = Corpus(corpus_dir)
    assert sorted(m.name for m in corpus) == ["lib", "main"]

    problem = get_problem("inline-size")
    for module in corpus:
        # the same backend as the driver's distributed ThinLTO compile, byte for byte
        bitcode = corpus_dir / f"{module.name}.bc"
        driver = [clang, "-Oz", "-x", "ir", str(bitcode), f"-fthinlto-index={bitcode}.thinlto.bc", "-c"]
        subprocess.run([*driver, "-o", str(tmp_path / "driver.o")], check=True, timeout=120)
        subprocess.run(module.argv(toolchain.clang, (), tmp_path / "corpus.o"), check=True, timeout=120)
        assert (tmp_path / "corpus.o").read_bytes() == (tmp_path / "driver.o").read_bytes(), module.name
    # main's backend imported `twice` from lib: the channel asks about it, and never-inline changes the object
    main = corpus.module("main")
    heuristic = rollout(problem, main, toolchain, resolve_policy("heuristic").build(), timeout=120,
                        record_features=True)  # fmt: skip
    never = rollout(problem, main, toolchain, resolve_policy("never").build(), timeout=120)
    assert heuristic.result.ok and never.result.ok
    imported = heuristic.trajectory.features[:, FEATURES.index("is_callee_avail_external")]
    assert 1 in imported and 1 in heuristic.trajectory.heuristic, "an imported callee, and clang inlines one"
    assert heuristic.result.metrics["text_bytes"] != never.result.metrics["text_bytes"]


def test_objects_that_are_not_bitcode_are_refused(toolchain, tmp_path):
    (tmp_path / "x.c").write_text(LIB)
    subprocess.run([str(toolchain.clang), "-Oz", "-c", "x.c", "-o", "x.o"], cwd=tmp_path, check=True)
    result = subprocess.run([*OPTGYM, "x.o", "-o", "c"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode != 0 and "is not bitcode: compile with -flto=thin" in result.stderr
    assert not (tmp_path / "c").exists()


def test_a_failed_link_leaves_no_corpus_behind(toolchain, tmp_path):
    (tmp_path / "lib.c").write_text(LIB)
    for out in ("a.o", "b.o"):  # the same definitions twice: the link fails on a duplicate symbol
        subprocess.run([str(toolchain.clang), "-Oz", "-flto=thin", "-c", "lib.c", "-o", out], cwd=tmp_path, check=True)
    result = subprocess.run([*OPTGYM, "a.o", "b.o", "-o", "c"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode != 0 and "the index-only link failed" in result.stderr, result.stderr
    assert "duplicate symbol" in result.stderr
    assert not (tmp_path / "c").exists()


# --- from a per-TU corpus --------------------------------------------------------------------------

APP_LIB = "int scale(int x) { return 3 * x + 1; }\nint twice(int x) { return 2 * scale(x); }\n" \
          "int unused_helper(int x) { return x * x * x - scale(x); }\n"  # fmt: skip
APP_MAIN = "int twice(int);\nint main(int argc, char **argv) { return twice(argc) + twice(argc + 1); }\n"
APP_TOOL = "int scale(int);\nint main(int argc, char **argv) { return scale(argc); }\n"


def _names(path: Path, nm: Path) -> set[str]:
    out = subprocess.run([str(nm), "--defined-only", "-j", str(path)], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def _per_tu(toolchain, tmp_path: Path, sources: dict[str, str]) -> Corpus:
    """A per-TU corpus of C sources named ``package/file``."""
    paths = {}
    for name, text in sources.items():
        paths[name] = tmp_path / f"{name.replace('/', '_')}.c"
        paths[name].write_text(text)
    return corpus_from_sources(toolchain, paths, tmp_path / "per-tu")


def _from_corpus(per_tu: Corpus, out: Path, jobs: int = 1) -> subprocess.CompletedProcess:
    return subprocess.run([*OPTGYM, "--from", str(per_tu.root), "-o", str(out), "-j", str(jobs)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_a_per_tu_corpus_becomes_the_backends_of_each_packages_programs(toolchain, tmp_path):
    sources = {"app/lib": APP_LIB, "app/main": APP_MAIN, "app/tool": APP_TOOL, "solo/only": APP_LIB}
    per_tu = _per_tu(toolchain, tmp_path, sources)
    out = tmp_path / "thin"
    result = _from_corpus(per_tu, out, jobs=2)
    assert result.returncode == 0 and "5 ThinLTO backends" in result.stdout, result.stderr
    corpus = Corpus(out)
    # a program is its main and what a static link of it loads from its package; no main: a shared library
    names = ["app/main/lib", "app/main/main", "app/tool/lib", "app/tool/tool", "solo/lib.so/only"]
    assert sorted(m.name for m in corpus) == names
    nm = toolchain.tool("llvm-nm")
    defined = {}
    for module in corpus:
        bitcode = out / f"{module.name}.bc"
        driver = [str(toolchain.clang), "-Oz", "-x", "ir", str(bitcode), f"-fthinlto-index={bitcode}.thinlto.bc", "-c"]
        subprocess.run([*driver, "-o", str(tmp_path / "driver.o")], check=True, timeout=120)
        subprocess.run(module.argv(toolchain.clang, (), tmp_path / "corpus.o"), check=True, timeout=120)
        assert (tmp_path / "corpus.o").read_bytes() == (tmp_path / "driver.o").read_bytes(), module.name
        defined[module.name] = _names(tmp_path / "corpus.o", nm)
    # the link decided what each backend keeps: what no program reaches is gone, a shared library keeps all
    assert "unused_helper" not in defined["app/main/lib"] | defined["app/tool/lib"]
    assert "twice" not in defined["app/tool/lib"]
    assert {"unused_helper", "twice", "scale"} <= defined["solo/lib.so/only"]
    assert corpus.description["optgym"]["prelink_failures"] == []


def test_a_module_that_does_not_pre_link_is_left_out_and_reported(toolchain, tmp_path):
    per_tu = _per_tu(toolchain, tmp_path, {"app/lib": APP_LIB, "app/main": APP_MAIN})
    broken = per_tu.module("app/lib").bitcode
    broken.write_bytes(broken.read_bytes()[:200])  # a truncated module: clang cannot read it
    out = tmp_path / "thin"
    result = _from_corpus(per_tu, out)
    assert result.returncode == 0, result.stderr
    corpus = Corpus(out)
    assert [m.name for m in corpus] == ["app/main/main"]
    [failure] = corpus.description["optgym"]["prelink_failures"]
    assert failure.startswith("app/lib:")


def test_a_static_link_loads_the_first_definition_of_each_missing_symbol_transitively():
    symbols = {
        "p/main": Symbols(frozenset({"main"}), frozenset({"a", "printf"})),
        "p/a1": Symbols(frozenset({"a"}), frozenset({"b"})),
        "p/a2": Symbols(frozenset({"a", "z"}), frozenset()),  # a second definition of a: never loaded
        "p/b": Symbols(frozenset({"b"}), frozenset({"a"})),
        "p/unused": Symbols(frozenset({"u"}), frozenset({"b"})),
        "p/tool": Symbols(frozenset({"main"}), frozenset({"u"})),
    }
    assert static_link("p/main", symbols, ["p/a1", "p/a2", "p/b", "p/unused"]) == ("p/main", "p/a1", "p/b")
    # loaded in the order of the symbols' names, whatever the hash seed: a link's order decides its duplicates
    many = {
        "m": Symbols(frozenset({"main"}), frozenset("zyxwvu")),
        **{c: Symbols(frozenset(c), frozenset()) for c in "uvwxyz"},
    }
    assert static_link("m", many, list("zyxwvu")) == ("m", *"uvwxyz")
    programs = package_programs("p", symbols, max_programs=3)
    assert [(p.name, set(p.modules)) for p in programs] == [
        ("p/tool", {"p/tool", "p/unused", "p/b", "p/a1"}),  # covers the most
        ("p/main", {"p/main", "p/a1", "p/b"}),  # adds its main only, still something new
    ]
    assert [p.name for p in package_programs("p", symbols, max_programs=1)] == ["p/tool"]
    assert package_programs("q", {"q/x": symbols["p/a1"]}, 3) == [Program("q/lib.so", ("q/x",), shared=True)]


def test_a_backends_cache_key_covers_its_index(toolchain, tmp_path):
    """The index decides what a backend imports and keeps, but the command only names it: a corpus rebuilt
    in the same place with other programs must not hit the caches of the old one."""
    per_tu = _per_tu(toolchain, tmp_path, {"app/lib": APP_LIB, "app/main": APP_MAIN})
    out = tmp_path / "thin"
    result = _from_corpus(per_tu, out)
    assert result.returncode == 0, result.stderr
    before = Corpus(out).module("app/main/lib").digest
    index = out / "app/main/lib.bc.thinlto.bc"
    index.write_bytes(index.read_bytes() + b"\0")
    assert Corpus(out).module("app/main/lib").digest != before


def test_a_backend_compiles_the_same_from_a_corpus_opened_by_a_relative_path(toolchain, tmp_path, monkeypatch):
    """A backend's module identifier is its input path: given relatively, clang finds none of its summaries in
    the index and compiles the module to nothing, without an error. Modules compile from their real path."""
    per_tu = _per_tu(toolchain, tmp_path, {"app/lib": APP_LIB, "app/main": APP_MAIN})
    result = _from_corpus(per_tu, tmp_path / "thin")
    assert result.returncode == 0, result.stderr
    monkeypatch.chdir(tmp_path)
    objects = {}
    for label, root in (("absolute", tmp_path / "thin"), ("relative", Path("thin"))):
        module = Corpus(root).module("app/main/lib")
        subprocess.run(module.argv(toolchain.clang, (), tmp_path / f"{label}.o"), check=True, timeout=120)
        objects[label] = (tmp_path / f"{label}.o").read_bytes()
    assert objects["relative"] == objects["absolute"]
    assert "twice" in _names(tmp_path / "relative.o", toolchain.tool("llvm-nm"))


def test_thinlto_backends_travel_to_ray_workers_as_paths(tmp_path):
    """By content they would land at another path without their index and imports: such a worker would
    compile them to nothing (previous test). No connection is made: the modules come back as they are."""
    (tmp_path / "m.bc").write_bytes(b"BC\xc0\xde")
    (tmp_path / "m.cmd").write_bytes(
        b"\0".join([b"-cc1", b"-Oz", f"-fthinlto-index={tmp_path}/m.bc.thinlto.bc".encode()])
    )
    (tmp_path / "m.bc.thinlto.bc").write_bytes(b"index")
    module = Module("m", tmp_path / "m.bc", tmp_path / "m.cmd")
    assert module.thinlto_index == tmp_path / "m.bc.thinlto.bc"
    assert portable_modules([module], workers=2, ray_address="127.0.0.1:1") == [module]


CAPTURED_CMAKE = """cmake_minimum_required(VERSION 3.16)
project(captured C CXX)
add_library(twice STATIC lib.c)
add_executable(app main.cpp)
target_link_libraries(app twice)
"""
MAIN_CPP = (
    '#include <string>\nextern "C" int twice(int);\n'
    "int main(int argc, char **argv) { std::string s(argv[0]); return twice(argc + (int)s.size()) & 1; }\n"
)


def test_a_builds_real_links_become_a_corpus_whose_modules_compile_to_what_the_link_got(toolchain, tmp_path):
    """``--build``: a CMake build with a static library, linked with ThinLTO by lld. Every backend of the program's
    link is a module (not CMake's compiler probes), its language is its source's, and compiling it from the corpus
    gives the native object lld linked, byte for byte — also for the member lld extracted from the archive, and
    with the ThinLTO plan's LLVM options, which the link gave every backend (a function alignment that shows in
    every object)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(CAPTURED_CMAKE)
    (src / "lib.c").write_text(LIB)
    (src / "main.cpp").write_text(MAIN_CPP)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"format": PLAN_FORMAT, "llvm_options": ["-align-all-functions=6"]}))
    corpus_dir = tmp_path / "corpus"
    result = subprocess.run([*OPTGYM, "--build", str(src), "-o", str(corpus_dir), "-j", "2"], capture_output=True,
                            text=True, timeout=600, env={**os.environ, "OPTGYM_LTO_PLAN": str(plan)})  # fmt: skip
    assert result.returncode == 0 and "2 ThinLTO backends" in result.stdout, result.stdout + result.stderr
    corpus = Corpus(corpus_dir)
    modules = {m.name.split("/")[-1]: m for m in corpus}
    member = next(name for name in modules if name.startswith("libtwice.a_lib.c.o_at_"))
    assert sorted(modules) == sorted(["main.cpp", member]) and all(m.name.startswith("app/") for m in corpus)
    assert modules["main.cpp"].language == "C++" and modules[member].language == "C"

    problem = get_problem("inline-size")
    from optgym.rollout import plain_compile

    for module in corpus:
        kept, replayed = tmp_path / f"{module.name.replace('/', '_')}.o", tmp_path / "replayed.o"
        assert plain_compile(problem, module, toolchain, keep_object=kept).ok
        linked = [p for p in module.workdir.glob("*.native.o") if p.read_bytes() == kept.read_bytes()]
        assert len(linked) == 1  # the object lld linked into app
        heuristic = rollout(problem, module, toolchain, resolve_policy("heuristic").build(), keep_object=replayed)
        assert heuristic.result.ok and replayed.read_bytes() == kept.read_bytes()
        assert "-align-all-functions=6" in module.argv(toolchain.clang, [], "-")
    assert rollout(problem, modules["main.cpp"], toolchain, resolve_policy("heuristic").build()).result.decisions > 0
