#!/usr/bin/env python3
"""Draw an unseen set of Debian source packages by a written rule and a seed, before any optgym figure of it.

    .venv/bin/python -m research.draw_set pool -o POOL.json
    .venv/bin/python -m research.draw_set check POOL.json --seed N --want 5 -o DIR [--skip NAME ...]
    .venv/bin/python -m research.draw_set check POOL.json --seed N --want 5 -o DIR --corpus   # a per-object C set
    .venv/bin/python -m research.draw_set check POOL.json --seed N -o DIR --corpus --language C++
    .venv/bin/python -m research.draw_set check POOL.json --seed N -o DIR --corpus --target aarch64-linux-gnu

Why: hand-named sets decide their own totals (lto4–lto6 in docs/experiments), so an unseen set is drawn instead.
``pool`` lists bookworm's source packages that meet every condition below; ``check`` shuffles that list with
``random.Random(seed)`` and walks it, taking each package that the mirror serves, whose build dependencies
install, that builds with plain clang-22 under ThinLTO (``-Oz -flto=thin -fuse-ld=lld``) within the time limit, and
whose test suite runs tests that pass on that plain build, until ``--want`` are taken. Nothing of optgym's runs:
the set is fixed before optgym builds any of it. ``DIR/draw.json`` records every draw and why it was taken or not.

The pool's conditions:

- Section ``libs`` (``--section``: others; lto8 walked that pool to its end).
- ``Build-Depends`` names CMake, Meson or the autotools.
- No other toolchain or heavy framework: see :data:`HEAVY`.
- The orig tarball is at most 3 MB.
- The name (and the name without trailing digits: ``pcre3`` is "pcre") appears nowhere in what optgym has
  measured or trained on: ``docs/``, ``research/``, ``maintainer/``, the shipped provenance and corpus presets.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from optgym.corpus.debian import control_stanzas

REPO = Path(__file__).resolve().parent.parent
#: Build-Depends that mean a toolchain or framework beyond a C/C++ build (substrings of a dependency's name)
HEAVY = ("cargo", "rustc", "golang", "jdk", "javahelper", "maven", "qt", "gtk", "boost", "ghc", "ocaml", "mono-",
         "nodejs", "fp-compiler", "gnat", "gfortran", "ruby", "texlive", "kf5", "kf6", "wx", "llvm", "clang",
         "swig", "vala", "gobject-introspection")  # fmt: skip
BUILD_SYSTEMS = ("cmake", "meson", "autoconf", "automake", "dh-autoreconf", "autotools-dev")
MAX_ORIG_BYTES = 3_000_000
#: where the names optgym has already seen are written
SEEN_PLACES = ("docs", "research", "maintainer", "src/optgym/policies/pretrained", "src/optgym/corpus",
               "src/optgym/evaluate/benchmarks")  # fmt: skip


def sources_stanzas() -> list[dict[str, str]]:
    """Every stanza of the bookworm main Sources index apt has (``apt-get update`` with deb-src first)."""
    files = subprocess.run(["apt-get", "indextargets", "--format", "$(FILENAME)", "Identifier: Sources"],
                           capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    main = [f for f in files if "_bookworm_main_" in f]
    text = subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", *main], capture_output=True, text=True, check=True)
    return [fields for fields in control_stanzas(text.stdout) if "Package" in fields]


def seen_text() -> str:
    """Everything the names are checked against, lower-cased."""
    parts = []
    for place in SEEN_PLACES:
        for path in sorted((REPO / place).rglob("*")):
            if path.is_file() and path.suffix in (".md", ".json", ".py", ".toml", ".txt"):
                parts.append(path.read_text(errors="replace").lower())
    return "\n".join(parts)


def dependency_names(field: str) -> list[str]:
    return [re.split(r"[\s(\[<]", d.strip(), maxsplit=1)[0] for d in re.split(r"[,|]", field) if d.strip()]


def in_pool(stanza: dict[str, str], seen: str, sections: tuple[str, ...] = ("libs",)) -> bool:
    """``sections``: the Debian sections a package may come from (``*``: any)."""
    if "*" not in sections and stanza.get("Section", "").rsplit("/", 1)[-1] not in sections:
        return False
    depends = dependency_names(stanza.get("Build-Depends", "") + "," + stanza.get("Build-Depends-Arch", ""))
    if not any(d in BUILD_SYSTEMS for d in depends) or any(h in d for d in depends for h in HEAVY):
        return False
    orig = [int(line.split()[1]) for line in stanza.get("Files", "").splitlines() if ".orig.tar" in line]
    if not orig or max(orig) > MAX_ORIG_BYTES:
        return False
    name = stanza["Package"].lower()
    return not any(re.search(rf"(?<![a-z0-9]){re.escape(n)}(?![a-z0-9])", seen) for n in {name, name.rstrip("0-9.")})


def pool(out: Path, sections: tuple[str, ...] = ("libs",)) -> None:
    seen = seen_text()
    names = sorted({s["Package"] for s in sources_stanzas() if in_pool(s, seen, sections)})
    out.write_text(json.dumps(names, indent=1) + "\n")
    print(f"{len(names)} packages in the pool: {out}")


def fetched(name: str, directory: Path, *options: str) -> bool:
    """Whether the mirror serves ``name``'s source: ``apt-get source`` into ``directory`` (made)."""
    directory.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["apt-get", "source", "-q", *options, name], cwd=directory, capture_output=True)
    return done.returncode == 0


def check_one(name: str, work: Path, minutes: int) -> str:
    """``taken``, or why not: fetch, build dependencies, the plain ThinLTO build, its test suite."""
    from optgym.corpus.debian import APT_LOCK_WAIT
    from optgym.evaluate.build_compare import BuildCompareError, _build_variant, detect_build_system, run_tests
    from research.plan_outputs import thinlto_setup

    fetch = work / name
    if not fetched(name, fetch):
        return "not fetched"
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    wait = ["-o", f"DPkg::Lock::Timeout={APT_LOCK_WAIT}"]  # another apt (a corpus build) is not the package's fault
    if subprocess.run(["apt-get", *wait, "build-dep", "-y", "-q", name], capture_output=True, env=env).returncode:
        return "build dependencies do not install"
    trees = [p for p in fetch.iterdir() if p.is_dir()]
    if len(trees) != 1:
        return "no single source tree"
    try:
        system = detect_build_system(trees[0])
    except BuildCompareError as e:  # a tree with no build system at its top
        return f"no build system: {e}"
    opts, tools, env = thinlto_setup(trees[0], work / f"{name}-check", "plain", 2)
    started = time.monotonic()
    record, tree = _build_variant(system, opts, "plain", tools, env, lambda _: None)
    if not record["ok"]:
        return "the plain ThinLTO build fails"
    if time.monotonic() - started > minutes * 60:
        return f"the build takes more than {minutes} minutes"
    tests = run_tests(system, opts, tools, tree, env, opts.outdir / "test.log")
    if tests["status"] == "passed" and not tests["passed"]:  # exit 0 with nothing counted: no test ran (libmtp)
        return "tests: none counted"
    return "taken" if tests["status"] == "passed" else f"tests: {tests['status']}"


#: ``check --corpus``: the modules of the set's language a package's corpus build must give for it to be taken
MIN_MODULES = 5


def language_modules(name: str, work: Path, target: Sequence[str] = (), language: str = "C") -> str:
    """``taken`` when ``optgym corpus debian NAME`` (clang-22 alone, no policy) gives at least :data:`MIN_MODULES`
    modules of ``language`` (C, or C++), else why not: for a per-object set (c14), whose packages need no test
    suite. ``target``: the corpus build's ``--target`` and ``--target-flag`` options, for another target's code."""
    from optgym.corpus import Corpus

    corpus = work / name
    if not fetched(name, work / f"{name}-fetch", "--download-only"):  # first, cheaply: most are not served
        return "not fetched"
    optgym = Path(sys.executable).parent / "optgym"
    subprocess.run([str(optgym), "corpus", "debian", name, "--build-deps", "-o", str(corpus), "-j", "2", *target],
                   capture_output=True)  # fmt: skip
    try:
        count = sum(m.family == language for m in Corpus(corpus))
    except Exception as e:  # no corpus at all: nothing fetched or built
        return f"no corpus: {type(e).__name__}"
    return "taken" if count >= MIN_MODULES else f"{count} {language} modules"


def check(
    pool_path: Path,
    seed: int,
    want: int,
    out: Path,
    skip: list[str],
    minutes: int,
    corpus: bool = False,
    target: Sequence[str] = (),
    language: str = "C",
) -> None:
    names = json.loads(pool_path.read_text())
    random.Random(seed).shuffle(names)
    out.mkdir(parents=True, exist_ok=True)
    record_path = out / "draw.json"
    draws = json.loads(record_path.read_text())["draws"] if record_path.is_file() else []
    decided = {d["name"]: d["outcome"] for d in draws}
    taken = [n for n, outcome in decided.items() if outcome == "taken"]
    for name in names:
        if len(taken) >= want:
            break
        if name in decided or name in skip:
            continue
        work = out / "work"
        outcome = language_modules(name, work, target, language) if corpus else check_one(name, work, minutes)
        draws.append({"name": name, "outcome": outcome})
        record_path.write_text(json.dumps({"seed": seed, "draws": draws}, indent=1) + "\n")
        print(name, outcome, flush=True)
        if outcome == "taken":
            taken.append(name)
    print("the set:", ", ".join(taken))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pool")
    p.add_argument("-o", "--output", type=Path, required=True)
    p.add_argument(
        "--section",
        action="append",
        default=[],
        help="a Debian section the pool takes (repeatable; * for any; default: libs)",
    )
    c = sub.add_parser("check")
    c.add_argument("pool", type=Path)
    c.add_argument("--seed", type=int, required=True)
    c.add_argument("--want", type=int, default=5)
    c.add_argument("--skip", action="append", default=[], help="a name the rule's corrections exclude")
    c.add_argument("--minutes", type=int, default=20)
    c.add_argument("--corpus", action="store_true", help="take packages by their modules (a per-object set)")
    c.add_argument("--language", default="C", choices=("C", "C++"), help="with --corpus: the set's language")
    c.add_argument("--target", help="with --corpus: build for this target (aarch64-linux-gnu, thumbv7em-none-eabi)")
    c.add_argument("--target-flag", action="append", default=[], help="with --target: a flag of its compiles")
    c.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "pool":
        pool(args.output, tuple(args.section) or ("libs",))
    else:
        if args.target and not args.corpus:
            parser.error("--target needs --corpus: a ThinLTO set is built for this machine")
        target = ["--target", args.target] if args.target else []
        target += [f"--target-flag={flag}" for flag in args.target_flag]
        check(args.pool, args.seed, args.want, args.output, args.skip, args.minutes, args.corpus, target, args.language)


if __name__ == "__main__":
    main()
