"""``optgym corpus debian``: Debian source packages → one corpus, module names ``<package>/…``.

Each package is fetched with ``apt-get source`` (which applies Debian's patches), built with its
upstream build system by :func:`optgym.corpus.build.build_tree` — not ``dpkg-buildpackage``, whose
``debian/rules`` set their own compilers and flags — and becomes a per-package corpus under
``DIR/.optgym-work/packages/<pkg>``. Those are then merged (hard links, no copies) into ``DIR``.

A package whose per-package corpus exists is not rebuilt, so an interrupted ``--preset train``
resumes where it stopped. A package that does not exist or fails is reported and the others go on.
Sources and build trees are deleted once a package is done (``keep_build`` keeps them): the heavy
packages' trees run to gigabytes.

Provenance: the merged description records, per package, the exact source version from its ``.dsc`` — and
the target it was built for, with ``--target`` (a package built for another target is built again).
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optgym.corpus.build import BuildStepError, build_tree
from optgym.corpus.corpus import Corpus, Module
from optgym.corpus.extract import matches, over_decision_limit
from optgym.corpus.staging import (
    LOGS_DIR,
    WORK_DIR,
    link_or_copy,
    now,
    read_description,
    staging_dir,
    swap_in,
    write_description,
)
from optgym.corpus.target import Target
from optgym.errors import CorpusError, OptgymError

APT_DIR = Path("/etc/apt")
DEB_SRC_FILE = APT_DIR / "sources.list.d" / "optgym-deb-src.sources"
APT_LOCK_WAIT = 900  # seconds apt-get waits for dpkg's lock held by another apt

#: Training packages (``--preset train``); ``demo`` is small enough to build in a few minutes on 2 cores.
CXX_PACKAGES = [
    "ninja-build",
    "googletest",
    "gflags",
    "google-glog",
    "benchmark",
    "re2",
    "abseil",
    "protobuf",
    "taglib",
    "zxing-cpp",
    "box2d",
    "libsass",
    "sentencepiece",
    "marisa",
    "hunspell",
    "uchardet",
    "graphite2",
    "libebml",
    "libmatroska",
    "jsonnet",
    "woff2",
    "tinyobjloader",
    "openexr",
    "bullet",
    "tinyxml",
]
C_PACKAGES = [
    "zlib",
    "bzip2",
    "xz-utils",
    "zstd",
    "libuv1",
    "sqlite3",
    "lua5.4",
    "libevent",
    "nghttp2",
    "c-ares",
    "libsodium",
    "cmark",
    "hiredis",
    "openjpeg2",
    "libwebp",
    "giflib",
    "libjpeg-turbo",
    "libtommath",
    "libtomcrypt",
    "mbedtls",
    "libxml2",
    "libarchive",
    "lzo2",
    "libdeflate",
    "flac",
    "opus",
    "libogg",
    "libvorbis",
    "speex",
    "lame",
    "json-c",
    "libconfig",
    "libcbor",
]
#: Upstream build options a package needs here (configure arguments; for plain Make, make variables):
#: parts that want bundled sources Debian strips (box2d's testbed wants glfw/imgui, benchmark's tests want
#: googletest's sources), and what ``debian/rules`` would otherwise have supplied —
#: * benchmark: Debian's patch comments out the version lookup from git and its rules pass ``GIT_VERSION``
#:   instead; without it the version is empty and ``set_target_properties(… VERSION ${GENERIC_LIB_VERSION}
#:   …)`` fails with "incorrect number of arguments". ``0.0.0`` means "no git version": upstream then uses
#:   the ``project()`` version. ``-Werror`` off, as in the rules, and ``-pedantic-errors`` too (its flag check
#:   is answered in advance): clang-22 calls ``__COUNTER__``, which benchmark.h uses, a C2y extension.
#: * lua5.4: Debian's patched Makefile compiles and links through ``$(LIBTOOL)``, which the rules set to a
#:   libtool they generate; the system's (package libtool) does the same job.
PACKAGE_CONFIGURE_ARGS: dict[str, tuple[str, ...]] = {
    "box2d": ("-DBOX2D_BUILD_TESTBED=OFF",),
    "benchmark": (
        "-DBENCHMARK_ENABLE_TESTING=OFF",
        "-DBENCHMARK_ENABLE_GTEST_TESTS=OFF",
        "-DGIT_VERSION=0.0.0",
        "-DBENCHMARK_ENABLE_WERROR=OFF",
        "-DHAVE_CXX_FLAG_PEDANTIC_ERRORS=OFF",
    ),
    "lua5.4": ("LIBTOOL=libtool --quiet",),
    # the +dfsg source drops examples/, which the demos, extras and unit tests are built from
    "bullet": (
        "-DBUILD_BULLET2_DEMOS=OFF",
        "-DBUILD_CPU_DEMOS=OFF",
        "-DBUILD_OPENGL3_DEMOS=OFF",
        "-DBUILD_EXTRAS=OFF",
        "-DBUILD_UNIT_TESTS=OFF",
        "-DBUILD_PYBULLET=OFF",
    ),
}
#: Files ``debian/rules`` generates before the upstream build, by path in the source tree (``{multiarch}``:
#: ``DEB_HOST_MULTIARCH``): lua5.4's patched luaconf.h includes a header its rules write at configure time.
PACKAGE_FILES: dict[str, dict[str, str]] = {
    "lua5.4": {
        "src/lua5.4-deb-multiarch.h": "#ifndef _LUA_DEB_MULTIARCH_\n#define _LUA_DEB_MULTIARCH_\n"
        '#define DEB_HOST_MULTIARCH "{multiarch}"\n#endif\n',
    },
}

#: The package `optgym demo` holds out: C++, where inlining has something to win (a held-out C package
#: can only tie clang: docs/experiments/2026-11-25-learned-inliner.md).
DEMO_HELD_OUT = "graphite2"
#: The slowest to build on 2 cores: last in the train preset, so an interrupted run has the rest.
HEAVY_PACKAGES = ("abseil", "protobuf", "openexr", "bullet")
PRESETS: dict[str, tuple[str, ...]] = {
    # two C and three small C++ packages to learn on, and graphite2 (C++, 68 modules) for `optgym demo` to hold out
    "demo": ("zlib", "cmark", "tinyxml", "libebml", "gflags", "graphite2"),
    "train": tuple(
        [p for p in C_PACKAGES + CXX_PACKAGES if p not in HEAVY_PACKAGES]
        + [p for p in CXX_PACKAGES if p in HEAVY_PACKAGES]
    ),
}


# ---------------------------------------------------------------------------------------------
# deb-src


def _source_files() -> list[Path]:
    files = [APT_DIR / "sources.list"]
    files += sorted((APT_DIR / "sources.list.d").glob("*.list"))
    files += sorted((APT_DIR / "sources.list.d").glob("*.sources"))
    return [f for f in files if f.is_file()]


def _stanzas(text: str) -> list[dict[str, str]]:
    """The deb822 stanzas of a ``.sources`` file: keys lower-cased, a folded field's lines joined by spaces."""
    return [{key.lower(): value.replace("\n", " ") for key, value in s.items()} for s in control_stanzas(text)]


def has_deb_src() -> bool:
    """Whether apt knows any enabled ``deb-src`` source."""
    for path in _source_files():
        text = path.read_text(errors="replace")
        if path.suffix == ".sources":
            for s in _stanzas(text):
                if "deb-src" in s.get("types", "").split() and s.get("enabled", "yes").lower() != "no":
                    return True
        elif any(line.split()[:1] == ["deb-src"] for line in text.splitlines()):
            return True
    return False


def codename() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("VERSION_CODENAME="):
                return line.split("=", 1)[1].strip().strip('"') or "bookworm"
    except FileNotFoundError:
        pass
    return "bookworm"


def deb_src_entry() -> str:
    """``Types: deb-src`` stanzas mirroring the ``deb`` ones (same mirror and keyring), or Debian's defaults."""
    release = codename()
    stanzas = []
    for path in _source_files():
        if path.suffix == ".sources" and path != DEB_SRC_FILE:
            for s in _stanzas(path.read_text(errors="replace")):
                suites = s.get("suites", "").split()
                if "deb" in s.get("types", "").split() and any(x.startswith(release) for x in suites):
                    stanzas.append(s)
    if not stanzas:
        keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
        stanzas = [
            {"uris": "http://deb.debian.org/debian", "suites": f"{release} {release}-updates",
             "components": "main", "signed-by": keyring},
            {"uris": "http://deb.debian.org/debian-security", "suites": f"{release}-security",
             "components": "main", "signed-by": keyring},
        ]  # fmt: skip
    out = ["# Written by `optgym corpus debian`: source packages for corpora (apt-get source)."]
    for s in stanzas:
        out += ["", "Types: deb-src", f"URIs: {s['uris']}", f"Suites: {s['suites']}",
                f"Components: {s.get('components', 'main')}"]  # fmt: skip
        if s.get("signed-by"):
            out.append(f"Signed-By: {s['signed-by']}")
    return "\n".join(out) + "\n"


def enable_deb_src(log: Path) -> Path | None:
    """Write :data:`DEB_SRC_FILE` and ``apt-get update`` when no deb-src exists; the file written, else None."""
    if has_deb_src():
        return None
    if os.geteuid() != 0:
        raise CorpusError(
            f"apt has no deb-src entry and optgym is not root; as root, write {DEB_SRC_FILE} with:\n"
            + deb_src_entry()
            + "then run `apt-get update`"
        )
    DEB_SRC_FILE.write_text(deb_src_entry())
    _apt(["apt-get", "update"], log)
    return DEB_SRC_FILE


def _apt(argv: Sequence[str], log: Path, cwd: Path | None = None) -> int:
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}
    if list(argv[:1]) == ["apt-get"]:  # wait for another apt (a second corpus run, say) instead of failing at once
        argv = [argv[0], "-o", f"DPkg::Lock::Timeout={APT_LOCK_WAIT}", *argv[1:]]
    with open(log, "a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        proc = subprocess.run(list(argv), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL)  # fmt: skip
    return proc.returncode


# ---------------------------------------------------------------------------------------------
# one package


@dataclass
class PackageResult:
    """How one requested package ended."""

    name: str
    status: str  # "built" | "cached" | "not_found" | "fetch_failed" | "build_deps_failed" | "build_failed"
    source: str = ""
    version: str = ""
    build_system: str = ""
    modules: int = 0
    seconds: float = 0.0
    detail: str = ""
    log: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status in ("built", "cached")


def _parse_dsc(path: Path) -> tuple[str, str]:
    source = version = ""
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("Source:"):
            source = line.split(":", 1)[1].strip()
        elif line.startswith("Version:"):
            version = line.split(":", 1)[1].strip()
    return source, version


def package_dir(dest: Path, name: str) -> Path:
    return Path(dest) / WORK_DIR / "packages" / name


@dataclass(frozen=True)
class PackageTask:
    """Everything one package's build needs (picklable: it may run in a worker)."""

    name: str
    dest: str
    opt: str
    workers: int | None
    build_deps: bool
    keep_build: bool
    thinlto: bool = False  # the backends of the package's real ThinLTO links, not its per-TU objects
    target: str | None = None  # another target's triple (optgym.corpus.target), else this machine's
    target_flags: tuple[str, ...] = ()  # the target's own flags, each one argument

    def built_for(self) -> dict[str, Any]:
        """What the package's description records of its target: a cached package is reused only for the same."""
        target = Target(self.target, self.target_flags) if self.target else None
        return target.provenance() if target else {"target": None, "target_flags": []}


def build_package(task: PackageTask) -> PackageResult:
    """Fetch, build and extract one package into its per-package corpus (skipped when already done).

    Never raises for a package's own trouble: a long preset run must reach its summary.
    """
    try:
        return _build_package(task)
    except Exception as e:  # a bug or an odd tree: report it with the package, and go on
        return PackageResult(task.name, "error", detail=f"{type(e).__name__}: {e}",
                             log=str(Path(task.dest) / LOGS_DIR / task.name))  # fmt: skip


def _build_package(task: PackageTask) -> PackageResult:
    from optgym.toolchain import find_toolchain

    start = time.perf_counter()
    dest = Path(task.dest)
    done = package_dir(dest, task.name)
    logs = dest / LOGS_DIR / task.name
    meta = read_description(done).get("optgym", {}).get("debian")
    if (
        meta
        and meta.get("opt") == task.opt
        and meta.get("thinlto", False) == task.thinlto
        and {"target": meta.get("target"), "target_flags": meta.get("target_flags", [])} == task.built_for()
    ):
        return PackageResult(task.name, "cached", meta["source"], meta["version"], meta.get("build_system", ""),
                             len(Corpus(done)), 0.0, log=str(logs))  # fmt: skip
    result = PackageResult(task.name, "fetch_failed", log=str(logs))
    shutil.rmtree(logs, ignore_errors=True)
    fetch = dest / WORK_DIR / "sources" / task.name
    shutil.rmtree(fetch, ignore_errors=True)  # a half-unpacked tree from an interrupted run
    fetch.mkdir(parents=True)
    fetch_log = logs / "fetch.log"
    try:
        if task.build_deps and _apt(["apt-get", "build-dep", "-y", "-q", task.name], logs / "build-dep.log"):
            log_text = (logs / "build-dep.log").read_text(errors="replace")
            result.status = "not_found" if "Unable to find a source package" in log_text else "build_deps_failed"
            result.detail, result.log = _last_error(log_text), str(logs / "build-dep.log")
            return result
        if task.build_deps and task.target and (arch := Target(task.target).debian_arch) and arch != host_arch():
            result.notes.append(target_build_deps(task.name, arch, logs / "build-dep.log"))
        if _apt(["apt-get", "source", "-q", task.name], fetch_log, cwd=fetch):
            log_text = fetch_log.read_text(errors="replace")
            result.status = "not_found" if "Unable to find a source package" in log_text else "fetch_failed"
            result.detail, result.log = _last_error(log_text), str(fetch_log)
            return result
        dscs = sorted(fetch.glob("*.dsc"))
        trees = [p for p in fetch.iterdir() if p.is_dir()]
        if len(dscs) != 1 or len(trees) != 1:
            result.detail = f"expected one .dsc and one source tree in {fetch}"
            return result
        result.source, result.version = _parse_dsc(dscs[0])
        for path, text in PACKAGE_FILES.get(task.name, {}).items():
            (trees[0] / path).write_text(text.format(multiarch=task.target or multiarch()))
        configure_args = PACKAGE_CONFIGURE_ARGS.get(task.name, ())
        try:
            if task.thinlto and task.target:
                raise CorpusError("--thinlto builds for this machine only: cross ThinLTO links are not captured yet")
            if task.thinlto:
                from optgym.corpus.thinlto import corpus_from_build

                start_build = time.perf_counter()
                result.modules = corpus_from_build(trees[0], done, opt=task.opt, workers=task.workers,
                                                   configure_args=configure_args, logs=logs)  # fmt: skip
                build_system, partial, build_seconds = "thinlto", False, time.perf_counter() - start_build
            else:
                target = Target(task.target, task.target_flags) if task.target else None
                built = build_tree(find_toolchain(), trees[0], done, opt=task.opt, workers=task.workers,
                                   configure_args=configure_args, logs=logs, provenance={},
                                   target=target)  # fmt: skip
                result.modules = len(built.extract.modules)
                result.notes += [*built.notes, *filter(None, [built.extract.opt_warning()])]
                build_system, partial, build_seconds = built.build_system, built.partial, built.build_seconds
        except BuildStepError as e:
            result.status, result.detail, result.log = "build_failed", f"step '{e.step}' failed", str(e.log)
            return result
        except OptgymError as e:
            result.status, result.detail = "build_failed", str(e).splitlines()[0]
            return result
        result.build_system = build_system
        # mark the package done: its description now names its source and version
        description = read_description(done)
        description["optgym"]["debian"] = {
            "package": task.name,
            "source": result.source,
            "version": result.version,
            "build_system": build_system,
            "opt": task.opt,
            "thinlto": task.thinlto,
            **task.built_for(),
            "partial": partial,
            "build_seconds": round(build_seconds, 1),
            "built": now(),
        }
        write_description(done, description["modules"], description["optgym"])
        result.status = "built"
        return result
    finally:
        result.seconds = time.perf_counter() - start
        if not task.keep_build:
            shutil.rmtree(fetch, ignore_errors=True)
            if result.ok:
                shutil.rmtree(done / WORK_DIR, ignore_errors=True)


def host_arch() -> str:
    """This machine's Debian architecture (``amd64``)."""
    done = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True)
    return done.stdout.strip() or platform.machine()


def target_build_deps(name: str, arch: str, log: Path) -> str:
    """Install, best effort, the libraries package ``name`` builds against, for the target's Debian ``arch``
    (``arm64``), as a cross build of it in Debian would; what was done, as a note.

    The host's build dependencies (tools, and the headers) are installed already; without the target's
    libraries, a cross build's configure finds headers but no library and stops (CMake's "Could NOT find ZLIB
    (missing: ZLIB_LIBRARY)"). ``apt-get build-dep -a ARCH`` installs them when every dependency resolves for a
    cross build; where one does not (``perl:arm64`` is not installable beside ``perl``), each ``-dev`` package
    of the source's ``Build-Depends`` is installed for ``arch`` on its own, skipping those that cannot be. The
    architecture is added to dpkg's foreign ones first (with ``apt-get update``) when it is not there.

    Nothing is removed for them (``--no-remove``): a ``-dev`` package that is not multiarch-safe replaces this
    machine's own, and the first version of this step let apt remove ``llvm-22-dev``, ``python3-venv`` and the
    system's ``python3`` that way; such a package is skipped instead."""
    foreign = subprocess.run(["dpkg", "--print-foreign-architectures"], capture_output=True, text=True).stdout
    if arch not in foreign.split():
        _apt(["dpkg", "--add-architecture", arch], log)
        _apt(["apt-get", "update", "-q"], log)
    install = ["apt-get", "-y", "-q", "--no-remove"]  # never at the cost of one of this machine's own packages
    if _apt([*install, "build-dep", "-a", arch, "-P", "cross,nocheck", name], log) == 0:
        return f"the build dependencies for {arch} installed (apt-get build-dep -a {arch})"
    shown = subprocess.run(["apt-cache", "showsrc", name], capture_output=True, text=True).stdout
    wanted = development_packages(shown)
    installed = [dev for dev in wanted if _apt([*install, "install", f"{dev}:{arch}"], log) == 0]
    return f"{len(installed)} of the {len(wanted)} -dev build dependencies installed for {arch} one by one"


def control_stanzas(text: str) -> list[dict[str, str]]:
    """The stanzas of a Debian control-format text (a Sources index, ``apt-cache showsrc``'s output), each field →
    its value, a folded field's lines joined by newlines; comment lines (in ``.sources`` files) skipped."""
    stanzas = []
    for block in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = ""
        for line in block.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            if line[0].isspace() and key:
                fields[key] += "\n" + line.strip()
            elif ":" in line:
                key, value = line.split(":", 1)
                key = key.strip()
                fields[key] = value.strip()
        if fields:
            stanzas.append(fields)
    return stanzas


def development_packages(showsrc: str) -> list[str]:
    """The ``-dev`` packages a source's first ``Build-Depends``/``Build-Depends-Arch`` (``apt-cache showsrc``) name:
    the first of each set of alternatives, without versions, architectures or build profiles."""
    newest = next(iter(control_stanzas(showsrc)), {})
    names: list[str] = []
    for entry in ",".join(newest.get(f, "") for f in ("Build-Depends", "Build-Depends-Arch")).split(","):
        first = re.sub(r"\(.*?\)|\[.*?\]|<.*?>", "", entry.split("|")[0]).strip().split(":")[0]
        if first.endswith("-dev") and first not in names:
            names.append(first)
    return names


def multiarch() -> str:
    """This machine's ``DEB_HOST_MULTIARCH`` (``x86_64-linux-gnu``), as ``debian/rules`` would see it."""
    try:
        out = subprocess.run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"], capture_output=True, text=True)
    except FileNotFoundError:  # no dpkg-dev: but apt-get source needs it to unpack, so hardly ever
        return f"{platform.machine()}-linux-gnu"
    return out.stdout.strip() or f"{platform.machine()}-linux-gnu"


def _last_error(log_text: str) -> str:
    errors = [line for line in log_text.splitlines() if line.startswith("E:")]
    return errors[0] if errors else (log_text.strip().splitlines() or [""])[-1]


# ---------------------------------------------------------------------------------------------
# the merged corpus


def held_packages(dest: Path) -> list[str]:
    """The packages (as they were asked for) that the corpus ``dest`` holds, in its order; ``[]`` for none."""
    held = read_description(Path(dest).absolute()).get("optgym", {}).get("packages", {})
    return [info.get("package", source) for source, info in held.items()]


def merge_packages(
    dest: Path,
    results: Iterable[PackageResult],
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    max_decisions: int | None = None,
    workers: int | None = None,
) -> tuple[int, dict[str, Any]]:
    """Merge the per-package corpora of the packages that built into ``dest``; (modules, packages meta).

    Filters apply here, not to the per-package corpora, so a later run with other filters rebuilds nothing;
    ``max_decisions`` left-outs are listed under ``optgym.max_decisions`` in the description.
    """
    dest = Path(dest).absolute()
    names: list[str] = []
    plan: list[tuple[str, str, Module]] = []  # (package prefix, merged name, module)
    packages: dict[str, Any] = {}
    previous = read_description(dest).get("optgym", {})
    with staging_dir(dest) as staging:
        for r in results:
            if not r.ok:
                continue
            pkg = Corpus(package_dir(dest, r.name))
            info = dict(pkg.description["optgym"]["debian"])
            prefix = info["source"] or r.name
            if prefix in packages:  # two requested names for one source package (a binary and its source)
                continue
            for m in pkg:
                name = f"{prefix}/{m.name}"
                if matches(name, include, exclude):
                    plan.append((prefix, name, m))
            info["modules"] = 0
            packages[prefix] = info
        left_out: dict[str, str] = {}
        if max_decisions is not None and plan:
            reasons = over_decision_limit([m for _, _, m in plan], max_decisions, workers=workers)
            left_out = {name: why for (_, name, _), why in zip(plan, reasons, strict=True) if why is not None}
        for prefix, name, m in plan:
            if name in left_out:
                continue
            for suffix, path in m.files():
                link_or_copy(path, staging / f"{name}{suffix}")
            names.append(name)
            packages[prefix]["modules"] += 1
        if not names:
            raise CorpusError("no package built: nothing to merge" if not plan else "every module was filtered out")
        meta: dict[str, Any] = {
            "provenance": {"tool": "optgym corpus debian", "created": now(), "distribution": codename()},
            "packages": packages,
        }
        targets = {info.get("target") for info in packages.values()}
        if len(targets) == 1 and None not in targets:  # every package built for one other target
            meta["provenance"]["target"] = targets.pop()
        if max_decisions is not None:
            meta["max_decisions"] = {"limit": max_decisions, "left_out": left_out}
        write_description(staging, names, meta)
        if "split" in previous:  # a stored split is re-applied, with its parameters, to the new module list
            from optgym.corpus.split import apply_split

            kept = [g for g in previous["split"].get("explicit_test_groups", []) if g in packages]
            apply_split(staging, **{k: previous["split"][k] for k in ("test_percent", "seed", "by")}, test_groups=kept)
        swap_in(staging, dest)
    return len(names), packages
