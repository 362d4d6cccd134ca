"""Robustness at scale: real Debian packages built by optgym-cc must never break, whatever the policy.

For each package (default: :data:`DEFAULT_PACKAGES`, 25 of the training list's quicker C and C++ packages), the
Debian source is fetched once (``apt-get source``; build dependencies with ``--build-deps``) and
``optgym compare-build SRC --test`` builds it twice per policy set — plain clang-22, then optgym-cc — and runs
its test suite on both builds:

* ``shipped`` — every shipped policy, pinned rather than left to optgym-cc's defaults (which may change):
  ``OPTGYM_POLICY``, ``OPTGYM_EVICT_POLICY`` and ``OPTGYM_PRIORITY_POLICY`` ``=pretrained`` and
  ``OPTGYM_CANDIDATES=3`` (a C compile is the shipped portfolio's first three ways, the smallest object kept:
  its pass options alone, its allocator scorers with them, and clang's own — every shipped way to compile C;
  the full run of 8635740 pinned 2, which under that commit's portfolio was the last two of these);
* ``random`` — ``random`` for every problem (inlining, eviction, priority): answers no trained policy would
  give, the worst case for the channel and for clang; with ``OPTGYM_TIMEOUT=300`` (random inlining keeps clang
  on sqlite3's amalgamation for over 19 minutes: killed after 300 s of compiler time, that compile is clang's
  own).

A set's variables are exactly what it defines: every variable any set defines is removed from the environment
before a set's own are applied, so nothing of one set (or of the caller's environment) leaks into the next.

optgym-cc may fall back to clang's own compile (one warning line; that is its contract, not a failure), so
the builds run without ``OPTGYM_STRICT``; the fallbacks are counted from the build's and the test suite's logs
(a ``make check`` compiles its test programs with optgym-cc too). A **broken build** is an optgym build that
fails where the plain one built, or a test that fails only in the optgym build. Target: 0.
Packages whose fetch or plain build fails, or whose build links nothing (zlib's Makefile without its
``configure``: a no-op that "succeeds"), are reported and skipped (they say nothing about optgym).

    .venv/bin/python bench/build_robustness.py [PKG ...] [--sets shipped,random] [--build-deps] [-o DIR] [-j 2]

Writes ``DIR/robustness.json`` and prints one line per package and set, then the totals.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

from optgym.evaluate.build_compare import CompareOptions, compare_build

POLICY_SETS: dict[str, dict[str, str]] = {
    "shipped": {"OPTGYM_POLICY": "pretrained", "OPTGYM_EVICT_POLICY": "pretrained",
                "OPTGYM_PRIORITY_POLICY": "pretrained", "OPTGYM_CANDIDATES": "3"},
    "random": {"OPTGYM_POLICY": "random", "OPTGYM_EVICT_POLICY": "random", "OPTGYM_PRIORITY_POLICY": "random",
               "OPTGYM_TIMEOUT": "300"},
}  # fmt: skip
#: Every variable a set defines: removed before each set's own are applied.
SET_VARIABLES = sorted({variable for variables in POLICY_SETS.values() for variable in variables})
#: A tree's build systems by the files that announce them, in compare-build's order of preference.
SYSTEM_FILES = {"cmake": ("CMakeLists.txt",), "meson": ("meson.build",),
                "autotools": ("configure", "configure.ac", "autogen.sh"), "make": ("Makefile", "makefile")}  # fmt: skip
#: 15 C and 10 C++ packages of the training list (none of its heavy ones) that plain clang-22 builds here, the
#: cheaper first and sqlite3 last (``random`` inlining on its amalgamation runs into ``OPTGYM_TIMEOUT``). Left
#: out: zstd, giflib, tinyxml, json-c, hiredis, lua5.4, jsonnet (their plain clang-22 build fails or, lua5.4's,
#: links nothing), zlib (Debian's CMake build misses a file, its ``configure`` rejects ``CC=``, its Makefile
#: alone builds nothing), libcbor, marisa, libmatroska (``apt-get source`` fails), flac (its suite runs 8
#: minutes per build), libwebp and box2d (no test suite runs; 20 built plainly without them).
DEFAULT_PACKAGES = [
    "bzip2", "uchardet", "libvorbis", "libogg", "gflags", "libebml", "cmark", "libdeflate", "tinyobjloader",
    "woff2", "libtommath", "googletest", "speex", "graphite2", "ninja-build", "libconfig", "c-ares", "lzo2",
    "libuv1", "lame", "hunspell", "opus", "xz-utils", "libsodium", "sqlite3",
]  # fmt: skip


def fetch(package: str, sources: Path, build_deps: bool) -> Path | None:
    """The unpacked Debian source tree of ``package`` under ``sources`` (fetched once), or ``None``."""
    found = [p for p in (sources / package).glob("*") if p.is_dir()] if (sources / package).exists() else []
    if found:
        return found[0]
    (sources / package).mkdir(parents=True, exist_ok=True)
    if build_deps:
        # waiting for dpkg's lock (another apt on a shared machine) rather than failing, and the build with it
        subprocess.run(["apt-get", "build-dep", "-y", "-q", "-o", "DPkg::Lock::Timeout=900", package],
                       capture_output=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})  # fmt: skip
    subprocess.run(["apt-get", "source", "-q", package], cwd=sources / package, capture_output=True)
    found = [p for p in (sources / package).glob("*") if p.is_dir()]
    return found[0] if found else None


def linked_nothing(report: dict) -> bool:
    """Both builds "succeeded" without linking or archiving anything: nothing was built (zlib's Makefile without
    its ``configure`` only prints "Please use ./configure first")."""
    return not report.get("outputs") and not report.get("archives")


def build_both(source: Path, outdir: Path, jobs: int, system: str | None) -> dict:
    """``compare_build`` with the tests, falling back to the tree's next build system while the plain build fails
    or builds nothing (Debian's repacked zlib drops a file its CMake build needs)."""
    present = [s for s, names in SYSTEM_FILES.items() if any((source / n).is_file() for n in names)]
    report: dict = {}
    for candidate in [system] if system else present or ["auto"]:
        opts = CompareOptions(source, outdir, build_system=candidate, jobs=jobs, test=True, allow_fallback=True)
        report = compare_build(opts)
        plain, optgym = report["builds"]["plain"], report["builds"].get("optgym", {})
        if plain["ok"] and (not optgym.get("ok") or not linked_nothing(report)):
            break
    return report


def optgym_lines(*logs: str) -> tuple[int, int]:
    """optgym-cc's warning lines in the optgym build's logs: (compiles that fell back to clang's own, others)."""
    fell_back = others = 0
    for log in logs:
        try:
            text = Path(log).read_text(errors="replace")
        except OSError:
            continue
        warnings = [line for line in text.splitlines() if line.startswith("optgym-cc: warning:")]
        fell_back += sum("compiled without optgym" in line for line in warnings)
        others += sum("compiled without optgym" not in line for line in warnings)
    return fell_back, others


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="*", default=DEFAULT_PACKAGES)
    parser.add_argument("--sets", default="shipped,random", help=f"comma-separated: {', '.join(POLICY_SETS)}")
    parser.add_argument("--build-deps", action="store_true", help="apt-get build-dep each package first")
    parser.add_argument("-o", "--output", type=Path, default=Path("build-robustness"))
    parser.add_argument("-j", "--jobs", type=int, default=2)
    args = parser.parse_args()
    out = args.output.absolute()
    results: list[dict] = []
    systems: dict[str, str] = {}
    for package in args.packages:
        source = fetch(package, out / "sources", args.build_deps)
        if source is None:
            results.append({"package": package, "status": "not_fetched"})
            print(f"{package}: source not fetched", flush=True)
            continue
        for name in args.sets.split(","):
            if results and results[-1].get("package") == package and results[-1]["status"].startswith("skipped"):
                continue  # the plain build is the same for every set: not built again
            for variable in SET_VARIABLES:
                os.environ.pop(variable, None)
            os.environ.update(POLICY_SETS[name])
            start = time.perf_counter()
            try:
                report = build_both(source, out / "builds" / package / name, args.jobs, systems.get(package))
            except Exception as e:  # the bench's own trouble with a tree: recorded, the others go on
                results.append({"package": package, "set": name, "status": "error", "detail": str(e)})
                print(f"{package} [{name}]: error {e}", flush=True)
                continue
            systems[package] = report["build_system"]  # the one that built: the next set uses it too
            plain, optgym = report["builds"]["plain"], report["builds"].get("optgym", {})
            tests = report.get("tests", {})
            broken = bool(plain["ok"]) and (not optgym.get("ok") or bool(tests.get("fail_only_in_optgym")))
            if not plain["ok"]:
                status = "skipped_plain_failed"
            elif broken:
                status = "broken"
            else:
                status = "skipped_built_nothing" if linked_nothing(report) else "ok"
            fell_back, warnings = optgym_lines(optgym.get("log", ""), tests.get("optgym", {}).get("log", ""))
            row = {
                "package": package, "set": name, "source": source.name, "build_system": report["build_system"],
                "status": status, "fallbacks": fell_back, "other_warnings": warnings,
                "tests": {v: tests.get(v, {}).get("status") for v in ("plain", "optgym")},
                "tests_failed": {v: tests.get(v, {}).get("failed") for v in ("plain", "optgym")},
                "fail_only_in_optgym": tests.get("fail_only_in_optgym", []),
                "text_ratio": (report.get("totals") or {}).get("ratio", {}).get("text"),
                "archive_text_ratio": (report.get("archive_totals") or {}).get("ratio", {}).get("text"),
                "build_ratio": report.get("build_ratio"), "seconds": round(time.perf_counter() - start, 1),
                "optgym_environment": report.get("optgym_environment"),
            }  # fmt: skip
            results.append(row)
            print(f"{package} [{name}]: {row['status']}, tests {row['tests']}, fallbacks {row['fallbacks']}, "
                  f"linked text ×{row['text_ratio']}, {row['seconds']} s", flush=True)  # fmt: skip
            (out / "robustness.json").write_text(json.dumps(results, indent=2))
    measured = [r for r in results if r.get("status") in ("ok", "broken")]
    broken = [r for r in measured if r["status"] == "broken"]
    packages = sorted({r["package"] for r in measured})
    names = ", ".join(f"{r['package']} [{r['set']}]" for r in broken) or "none"
    print(f"{len(packages)} packages built plainly; {len(measured)} optgym builds; {len(broken)} broken ({names}); "
          f"{sum(r['fallbacks'] for r in measured)} compiles fell back; "
          f"{len({r['package'] for r in results} - set(packages))} packages skipped")  # fmt: skip


if __name__ == "__main__":
    main()
