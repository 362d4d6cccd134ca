"""Debian source packages: a missing package is reported, not fatal; one real package (slow)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from optgym.corpus import Corpus, debian


def _cli(*args, timeout=1800):
    return subprocess.run([sys.executable, "-m", "optgym.cli", "corpus", "debian", *args],
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def test_deb_src_entry_mirrors_the_deb_sources():
    entry = debian.deb_src_entry()
    assert entry.count("Types: deb-src") >= 2
    release = debian.codename()
    assert f"Suites: {release} {release}-updates" in entry and f"{release}-security" in entry


def test_presets():
    assert set(debian.PRESETS["demo"]) <= set(debian.PRESETS["train"])
    assert any(p in debian.CXX_PACKAGES for p in debian.PRESETS["demo"])
    assert len(debian.PRESETS["train"]) == len(debian.CXX_PACKAGES) + len(debian.C_PACKAGES) == 58


def test_missing_package_is_reported_not_fatal(tmp_path):
    """Through the CLI first: on a fresh machine it enables deb-src (as root) or says how to."""
    proc = _cli("optgym-no-such-package", "-o", str(tmp_path / "c"), timeout=300)
    if not debian.has_deb_src():  # not root: a clear error that names the file to write
        assert proc.returncode == 1 and str(debian.DEB_SRC_FILE) in proc.stderr and "Types: deb-src" in proc.stderr
        return
    assert proc.returncode == 1, proc.stderr  # nothing was built: the only case that fails
    assert "not_found" in proc.stdout and "no package was built" in proc.stderr
    task = debian.PackageTask("optgym-no-such-package", str(tmp_path), "-Oz", 1, False, False)
    result = debian.build_package(task)
    assert result.status == "not_found" and "Unable to find a source package" in result.detail


@pytest.mark.slow
def test_real_package_builds_and_a_missing_one_goes_on(tmp_path):
    out = tmp_path / "c"
    proc = _cli("zlib", "optgym-no-such-package", "-o", str(out), "-j", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "not_found" in proc.stdout
    corpus = Corpus(out)
    assert len(corpus) >= 10 and all(m.name.startswith("zlib/") for m in corpus)
    zlib = corpus.description["optgym"]["packages"]["zlib"]
    assert zlib["version"].startswith("1:1.2") and zlib["modules"] == len(corpus)
    assert not (out / ".optgym-work" / "sources" / "zlib").exists(), "sources are deleted once a package is done"
    again = _cli("zlib", "-o", str(out), "-j", "2")
    assert again.returncode == 0 and "cached" in again.stdout
    desc = json.loads((out / "corpus_description.json").read_text())
    assert desc["modules"] == [m.name for m in corpus]
    added = _cli("optgym-no-such-package", "--add", "-o", str(out), "-j", "2")  # keeps zlib: no "nothing built"
    assert added.returncode == 0 and "cached" in added.stdout, added.stdout + added.stderr
    assert [m.name for m in Corpus(out)] == desc["modules"] and debian.held_packages(out) == ["zlib"]


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="installing a package's libraries for another architecture needs root")
def test_a_cross_build_gets_the_targets_libraries(tmp_path):
    """lsyncd's CMake needs Lua's library: built for AArch64 with only this machine's build dependencies, it
    stopped at "Could NOT find Lua (missing: LUA_LIBRARIES)". ``--build-deps`` installs arm64's too."""
    from optgym.corpus.info import raw_cc1_args
    from optgym.corpus.target import module_triple

    out = tmp_path / "c"
    proc = _cli("lsyncd", "--target", "aarch64-linux-gnu", "--build-deps", "-o", str(out), "-j", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "for arm64" in proc.stdout and "arm64" in debian.subprocess.run(
        ["dpkg", "--print-foreign-architectures"], capture_output=True, text=True).stdout  # fmt: skip
    corpus = Corpus(out)
    assert len(corpus) >= 1 and {module_triple(raw_cc1_args(m)).split("-")[0] for m in corpus} == {"aarch64"}


@pytest.mark.skipif(os.geteuid() != 0, reason="holding dpkg's lock needs root")
def test_apt_waits_for_a_lock_another_apt_holds(tmp_path):
    """Two corpus runs at once (say the training list and a package set to evaluate on) both call
    ``apt-get build-dep``; without a lock timeout the second fails at once with "Could not get lock" and
    its packages are reported as build_deps_failed. Here the lock is held for a moment as apt holds it."""
    lock = os.open("/var/lib/dpkg/lock-frontend", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.lockf(lock, fcntl.LOCK_EX)  # waits if a real apt holds it now
        release = threading.Timer(1.5, fcntl.lockf, (lock, fcntl.LOCK_UN))
        release.start()
        start = time.monotonic()
        code = debian._apt(["apt-get", "install", "-y", "-q", "make"], tmp_path / "apt.log")  # already installed
        waited = time.monotonic() - start
        release.join()
    finally:
        os.close(lock)  # releases the lock too, if the timer never ran
    log = (tmp_path / "apt.log").read_text()
    assert code == 0, log
    assert waited >= 1.4 and "DPkg::Lock::Timeout" in log.splitlines()[0]


#: The first stanza of ``apt-cache showsrc libemf2svg`` (bookworm), cut to the fields read, plus an entry with
#: alternatives, an architecture list, a build profile and an arch qualifier, as other sources write them.
SHOWSRC = """Package: libemf2svg
Binary: libemf2svg-dev, libemf2svg1, emf2svg-conv
Version: 1.1.0+ds-3
Build-Depends: cmake, debhelper-compat (= 13), help2man, libfontconfig-dev, libfreetype-dev, libpng-dev, libuemf-dev,
 perl, pkg-config, libssl-dev | libressl-dev [!hurd-i386] <!nocheck>, zlib1g-dev:native
Build-Depends-Arch: libfontconfig-dev, libcmocka-dev (>= 1.1)

Package: libemf2svg
Version: 1.0.0-1
Build-Depends: libold-dev
"""


def test_a_cross_builds_libraries_are_the_sources_dev_build_dependencies():
    """What a cross build installs for the target one by one when ``apt-get build-dep -a`` cannot resolve: the
    -dev packages of the newest stanza, the first of each set of alternatives, without versions or qualifiers."""
    assert debian.development_packages(SHOWSRC) == [
        "libfontconfig-dev", "libfreetype-dev", "libpng-dev", "libuemf-dev", "libssl-dev", "zlib1g-dev",
        "libcmocka-dev"]  # fmt: skip


def test_a_targets_libraries_never_cost_one_of_this_machines_packages(monkeypatch, tmp_path):
    """A -dev package that is not multiarch-safe replaces this machine's own: installing arm64's let apt remove
    llvm-22-dev and python3-venv. Every install for the target refuses removals. (apt is not run: a test must not
    change the machine's packages; the commands are what is checked, each path through the step once.)"""
    commands: list[list[str]] = []
    build_dep_resolves = [False]

    def apt(argv, log, cwd=None):
        commands.append(list(argv))
        return 0 if "install" in argv or build_dep_resolves[0] else 100

    def run(argv, **kwargs):
        out = {"dpkg": "arm64\n", "apt-cache": SHOWSRC}[argv[0]]
        return subprocess.CompletedProcess(argv, 0, stdout=out, stderr="")

    monkeypatch.setattr(debian, "_apt", apt)
    monkeypatch.setattr(debian.subprocess, "run", run)
    note = debian.target_build_deps("libemf2svg", "arm64", tmp_path / "log")
    assert note == "7 of the 7 -dev build dependencies installed for arm64 one by one"
    build_dep_resolves[0] = True
    assert "apt-get build-dep -a arm64" in debian.target_build_deps("libemf2svg", "arm64", tmp_path / "log")
    installs = [c for c in commands if "install" in c or "build-dep" in c]
    assert len(installs) == 9 and all("--no-remove" in c for c in installs)
