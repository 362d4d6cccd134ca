"""Robustness at scale: real Debian packages built by optgym-cc must never break, whatever the policy.

For each package (default: the first 20 of the training list's C and C++ packages that are not heavy), the
Debian source is fetched once (``apt-get source``; build dependencies with ``--build-deps``) and
``optgym compare-build SRC --test`` builds it twice per policy set — plain clang-22, then optgym-cc — and runs
its test suite on both builds:

* ``shipped`` — every shipped policy, as ``optgym-cc`` builds by default;
* ``random`` — ``random`` for every problem (inlining, eviction, priority): answers no trained policy would
  give, the worst case for the channel and for clang.

optgym-cc may fall back to clang's own compile (one warning line; that is its contract, not a failure), so
the builds run without ``OPTGYM_STRICT``; the fallbacks are counted from the build logs. A **broken build** is
an optgym build that fails where the plain one built, or a test that fails only in the optgym build. Target: 0.
Packages whose plain build or fetch fails are reported and skipped (they say nothing about optgym).

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

from optgym.corpus.debian import C_PACKAGES, CXX_PACKAGES, HEAVY_PACKAGES
from optgym.evaluate.build_compare import CompareOptions, compare_build

POLICY_SETS: dict[str, dict[str, str]] = {
    "shipped": {},
    "random": {"OPTGYM_POLICY": "random", "OPTGYM_EVICT_POLICY": "random", "OPTGYM_PRIORITY_POLICY": "random"},
}
#: 14 C and 6 C++ packages of the training list, the quicker ones to build on 2 cores.
#: A tree's build systems by the files that announce them, in compare-build's order of preference.
SYSTEM_FILES = {"cmake": ("CMakeLists.txt",), "meson": ("meson.build",),
                "autotools": ("configure", "configure.ac", "autogen.sh"), "make": ("Makefile", "makefile")}  # fmt: skip
DEFAULT_PACKAGES = [*C_PACKAGES[:14], *[p for p in CXX_PACKAGES if p not in HEAVY_PACKAGES][:6]]


def fetch(package: str, sources: Path, build_deps: bool) -> Path | None:
    """The unpacked Debian source tree of ``package`` under ``sources`` (fetched once), or ``None``."""
    found = [p for p in (sources / package).glob("*") if p.is_dir()] if (sources / package).exists() else []
    if found:
        return found[0]
    (sources / package).mkdir(parents=True, exist_ok=True)
    if build_deps:
        subprocess.run(["apt-get", "build-dep", "-y", "-q", package], capture_output=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})  # fmt: skip
    subprocess.run(["apt-get", "source", "-q", package], cwd=sources / package, capture_output=True)
    found = [p for p in (sources / package).glob("*") if p.is_dir()]
    return found[0] if found else None


def build_both(source: Path, outdir: Path, jobs: int, system: str | None) -> dict:
    """``compare_build`` with the tests, falling back to the tree's next build system while the plain build fails
    (Debian's repacked zlib drops a file its CMake build needs; its own configure works)."""
    present = [s for s, names in SYSTEM_FILES.items() if any((source / n).is_file() for n in names)]
    report: dict = {}
    for candidate in [system] if system else present or ["auto"]:
        opts = CompareOptions(source, outdir, build_system=candidate, jobs=jobs, test=True, allow_fallback=True)
        report = compare_build(opts)
        if report["builds"]["plain"]["ok"]:
            break
    return report


def fallbacks(log: str) -> int:
    """How many compiles of a build fell back to clang's own (optgym-cc's warning lines)."""
    try:
        return Path(log).read_text(errors="replace").count("compiled without optgym")
    except OSError:
        return 0


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
            os.environ.update(POLICY_SETS[name])
            for variable in {"OPTGYM_POLICY", "OPTGYM_EVICT_POLICY", "OPTGYM_PRIORITY_POLICY"} - set(POLICY_SETS[name]):
                os.environ.pop(variable, None)
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
            row = {
                "package": package, "set": name, "source": source.name,
                "status": "skipped_plain_failed" if not plain["ok"] else ("broken" if broken else "ok"),
                "fallbacks": fallbacks(optgym.get("log", "")),
                "tests": {v: tests.get(v, {}).get("status") for v in ("plain", "optgym")},
                "fail_only_in_optgym": tests.get("fail_only_in_optgym", []),
                "text_ratio": (report.get("totals") or {}).get("ratio", {}).get("text"),
                "build_ratio": report.get("build_ratio"), "seconds": round(time.perf_counter() - start, 1),
            }  # fmt: skip
            results.append(row)
            print(f"{package} [{name}]: {row['status']}, tests {row['tests']}, fallbacks {row['fallbacks']}, "
                  f"linked text ×{row['text_ratio']}", flush=True)  # fmt: skip
            (out / "robustness.json").write_text(json.dumps(results, indent=2))
    measured = [r for r in results if r.get("status") in ("ok", "broken")]
    broken = [r for r in measured if r["status"] == "broken"]
    packages = sorted({r["package"] for r in measured})
    names = ", ".join(f"{r['package']} [{r['set']}]" for r in broken) or "none"
    print(f"{len(packages)} packages built plainly; {len(measured)} optgym builds; {len(broken)} broken ({names}); "
          f"{sum(r['fallbacks'] for r in measured)} compiles fell back")  # fmt: skip


if __name__ == "__main__":
    main()
