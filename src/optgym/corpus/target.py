"""Corpora for another target than this machine: what a cross build of a source tree needs, per build system.

A policy learns one target's decisions (its cost model, its registers), so a corpus for AArch64 or a Cortex-M
is compiled *for* that target: ``--target=TRIPLE`` and the target's own flags (``-mcpu=cortex-m4 -mthumb``, a
C library's ``-isystem DIR``) go into every compile — last, in the compiler wrappers' tail
(:func:`optgym.corpus.build.write_compiler_wrappers`), so the build's own flags cannot drop them; links get
``-fuse-ld=lld`` (the system's ``ld`` links for this machine only) — and each build system is told it
cross-compiles, so it neither runs what it builds nor looks for this machine's libraries:

* CMake: ``CMAKE_SYSTEM_NAME`` (``Linux``, else ``Generic``), ``CMAKE_SYSTEM_PROCESSOR``,
  ``CMAKE_<LANG>_COMPILER_TARGET``, and Debian's cross root ``/usr/TRIPLE`` as the only place for libraries
  and packages when it exists; a bare-metal target (no OS: ``thumbv7em-none-eabi``) without a runtime to link
  against (:func:`bare_metal_runtime`) cannot link an executable, so CMake's compiler checks build a static
  library (``CMAKE_TRY_COMPILE_TARGET_TYPE=STATIC_LIBRARY``) and the build's own links fail, leaving the objects
  (shared libraries stay apart from static ones: :meth:`Target.cmake_project_include`);
  a Linux target's tests run under qemu-user (``CMAKE_CROSSCOMPILING_EMULATOR``, :meth:`Target.emulator`);
* Meson: a cross file (``[host_machine]``, the wrappers as ``c``/``cpp``, LLVM's ``ar``, qemu-user as
  ``exe_wrapper``);
* GNU autoconf: ``--host=TRIPLE`` (``thumb…`` spelled ``arm…``: config.sub knows no ``thumbv7em``);
* plain Make: nothing more than the wrappers.

A bare-metal Cortex-M target links its programs when Debian's picolibc has the multilib for its flags
(:func:`bare_metal_runtime`): each link of a program gets picolibc's semihosting start file, ``libc.a`` and
semihosting I/O, the multilib's ``libgcc.a`` and optgym's generic Cortex-M linker script
(``baremetal/cortex-m.ld``), so a configure script's compiler check passes and its function checks link against
a real C library. The programs are no real chip's firmware, but they run here under QEMU's MPS2 boards
(:mod:`optgym.corpus.qemu_system`), which is how a build's tests run for a Cortex-M.

The module's ``-cc1`` command records the target clang compiled for (``-triple``): :func:`module_triple`.
"""

from __future__ import annotations

import functools
import hashlib
import platform
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

#: Debian's root of a cross target's libraries and headers (``libc6-dev-arm64-cross``: ``/usr/aarch64-linux-gnu``).
CROSS_ROOT = Path("/usr")
#: Debian's name for an architecture, where it is not the triple's own.
DEBIAN_ARCH = {"aarch64": "arm64", "x86_64": "amd64", "powerpc64le": "ppc64el"}
#: qemu-user's name for an architecture, where it is not the triple's own (``qemu-user``: ``qemu-aarch64`` …).
QEMU_ARCH = {"arm64": "aarch64", "i486": "i386", "i586": "i386", "i686": "i386", "amd64": "x86_64"}
#: Debian's picolibc for ARM (``picolibc-arm-none-eabi``): ``lib/MULTILIB/{crt0.o,libc.a,libsemihost.a}``.
PICOLIBC_ARM = Path("/usr/lib/picolibc/arm-none-eabi")
#: optgym's lld-compatible linker script for any Cortex-M (picolibc's own ``picolibc.ld`` is GNU ld only).
CORTEX_M_SCRIPT = Path(__file__).resolve().parent / "baremetal" / "cortex-m.ld"
#: The bare-metal program's stdin, stdout and stderr on the host's own, through semihosting (compiled per multilib).
SEMIHOST_STDIO = Path(__file__).resolve().parent / "baremetal" / "semihost-stdio.c"
#: The GNU ARM compiler that picolibc's multilibs follow: it names a flag set's multilib and its ``libgcc.a``.
ARM_GCC = "arm-none-eabi-gcc"
#: The flags that choose an ARM multilib (the rest of a target's flags are the compile's business).
MULTILIB_FLAG_PREFIXES = ("-mcpu=", "-march=", "-mfpu=", "-mfloat-abi=")


@dataclass(frozen=True)
class Target:
    """A build's target: the triple, and the flags every compile for it gets (beside ``--target=``)."""

    triple: str
    flags: tuple[str, ...] = ()

    @classmethod
    def of(cls, triple: str | None, flags: Iterable[str] = ()) -> Target | None:
        """The target named by ``--target`` and ``--target-flag`` options, or ``None`` for this machine's.

        Each flag is split like a shell line, so ``--target-flag "-isystem /usr/include/x"`` is one option with
        its value; flags without a triple are refused (they would silently compile for this machine)."""
        split = tuple(arg for flag in flags for arg in shlex.split(flag))
        if not triple:
            if split:
                raise ValueError(f"--target-flag {shlex.join(split)} needs --target TRIPLE")
            return None
        return cls(triple, split)

    @property
    def arch(self) -> str:
        return self.triple.split("-", 1)[0]

    @property
    def bare_metal(self) -> bool:
        """No operating system (``*-none-*``, ``*-elf``): nothing links without the firmware's linker script."""
        parts = self.triple.split("-")
        return "none" in parts[1:] or (parts[-1] in ("elf", "eabi", "eabihf") and "linux" not in parts)

    @property
    def linux(self) -> bool:
        return "linux" in self.triple.split("-")

    @property
    def compile_flags(self) -> tuple[str, ...]:
        """What every compile (and link) for the target gets."""
        return (f"--target={self.triple}", *self.flags)

    @property
    def link_flags(self) -> tuple[str, ...]:
        """What a link for the target gets: LLVM's lld, which links for every target (the system's ``ld`` links
        for this machine only)."""
        return ("-fuse-ld=lld",)

    @property
    def program_link_flags(self) -> tuple[str, ...]:
        """What a link of a program (not ``-shared``, not ``-r``) gets beside :attr:`link_flags`: a bare-metal
        target's C runtime and linker script when there is one for it (:func:`bare_metal_runtime`), else nothing."""
        runtime = bare_metal_runtime(self)
        return runtime.link_flags if runtime else ()

    @property
    def cross_root(self) -> Path | None:
        """Debian's cross root of the target's libraries, when installed."""
        root = CROSS_ROOT / self.triple
        return root if (root / "include").is_dir() or (root / "lib").is_dir() else None

    @property
    def debian_arch(self) -> str | None:
        """Debian's name of the target's architecture (``dpkg --print-architecture``: ``arm64``, ``armhf``…), whose
        packages hold its libraries; ``None`` for a target Debian builds no packages for (no OS)."""
        if not self.linux:
            return None
        if self.arch.startswith(("arm", "thumb")):
            return "armhf" if self.triple.endswith("hf") else "armel"
        if len(self.arch) == 4 and self.arch[0] == "i" and self.arch.endswith("86"):
            return "i386"
        return DEBIAN_ARCH.get(self.arch, self.arch)

    @property
    def multiarch_libdir(self) -> Path | None:
        """Where Debian's packages of the target's architecture put their libraries (``/usr/lib/aarch64-linux-gnu``),
        when any are installed (``optgym corpus debian --build-deps --target`` installs a package's for it)."""
        libdir = Path("/usr/lib") / self.triple
        return libdir if self.linux and libdir.is_dir() else None

    def emulator(self) -> list[str] | None:
        """How this machine runs the target's programs: a Linux target's under qemu-user with the cross root as
        the loader's prefix (``qemu-aarch64 -L /usr/aarch64-linux-gnu``) — what a build's tests need, since a
        container has no binfmt handler to run them directly; a Cortex-M's whose programs link (a picolibc
        runtime) under QEMU's system emulator with semihosting (:mod:`optgym.corpus.qemu_system`). ``None``: the
        target runs here natively, or nothing here emulates it."""
        if self.bare_metal:
            # imported here: `python -m optgym.corpus.qemu_system` imports this package first
            from optgym.corpus.qemu_system import machine_for

            board = machine_for(self.arch, self.flags) if bare_metal_runtime(self) else None
            if board is None:
                return None
            return [sys.executable, "-m", "optgym.corpus.qemu_system", "--machine", board[0], "--cpu", board[1]]
        if not self.linux:
            return None
        arch = QEMU_ARCH.get(self.arch, "arm" if self.arch.startswith(("arm", "thumb")) else self.arch)
        if arch == QEMU_ARCH.get(platform.machine(), platform.machine()):
            return None
        qemu = shutil.which(f"qemu-{arch}")
        if qemu is None:
            return None
        return [qemu, *(["-L", str(self.cross_root)] if self.cross_root else [])]

    def provenance(self) -> dict[str, object]:
        """What a corpus's description records of its target."""
        return {"target": self.triple, "target_flags": list(self.flags)}

    # -- build systems ---------------------------------------------------------------------

    def cmake_args(self, *, links_programs: bool = False) -> list[str]:
        """CMake's cross-compilation settings for the target (see the module doc). ``links_programs``: the build's
        compiler gives a bare-metal target's links their runtime (:attr:`program_link_flags`, as the corpus build's
        wrappers do), so CMake's compiler checks may link programs too."""
        args = [
            f"-DCMAKE_SYSTEM_NAME={'Linux' if self.linux else 'Generic'}",
            f"-DCMAKE_SYSTEM_PROCESSOR={self.arch}",
            f"-DCMAKE_C_COMPILER_TARGET={self.triple}",
            f"-DCMAKE_CXX_COMPILER_TARGET={self.triple}",
        ]
        if self.bare_metal and not (links_programs and self.program_link_flags):
            args.append("-DCMAKE_TRY_COMPILE_TARGET_TYPE=STATIC_LIBRARY")
        if root := self.cross_root:
            # and the whole system where Debian's multiarch packages of the target are installed (apt-get
            # build-dep -a ARCH puts their libraries in /usr/lib/TRIPLE, which CMake searches by the target's
            # library architecture, never this machine's /usr/lib/x86_64-linux-gnu)
            roots = [str(root), "/"] if self.multiarch_libdir else [str(root)]
            args += [
                f"-DCMAKE_FIND_ROOT_PATH={';'.join(roots)}",
                "-DCMAKE_FIND_ROOT_PATH_MODE_PROGRAM=NEVER",
                "-DCMAKE_FIND_ROOT_PATH_MODE_LIBRARY=ONLY",
                "-DCMAKE_FIND_ROOT_PATH_MODE_PACKAGE=ONLY",
            ]
        if (pkg_config := shutil.which(f"{self.triple}-pkg-config")) and self.multiarch_libdir:
            args.append(f"-DPKG_CONFIG_EXECUTABLE={pkg_config}")  # the target's .pc files, as Debian's cross build
        if emulator := self.emulator():  # ctest runs the tests through it
            args.append(f"-DCMAKE_CROSSCOMPILING_EMULATOR={';'.join(emulator)}")
        return args

    def cmake_project_include(self, directory: Path) -> list[str]:
        """For a bare-metal target: a file CMake includes after each ``project()`` and the argument naming it.

        CMake's ``Generic`` platform supports no shared libraries, so it quietly builds ``add_library(SHARED)``
        as a static one; a project that also builds a static library of the same name (json-c, cmark) then has
        two rules for one archive, which Ninja refuses, and the whole build is lost. Declaring shared libraries
        supported keeps the two apart: their objects compile, and the shared library's link fails like every
        bare-metal link."""
        if not self.bare_metal:
            return []
        path = directory / "optgym-bare-metal.cmake"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("# optgym: keep SHARED libraries apart from STATIC ones on a target without an OS\n"
                        "set_property(GLOBAL PROPERTY TARGET_SUPPORTS_SHARED_LIBS TRUE)\n")  # fmt: skip
        return [f"-DCMAKE_PROJECT_INCLUDE={path}"]

    @property
    def autotools_triple(self) -> str:
        """The target as GNU config.sub spells it (``thumb…`` as ``arm…``)."""
        arch, _, rest = self.triple.partition("-")
        if arch.startswith("thumb"):
            arch = "arm"
        return f"{arch}-{rest}" if rest else arch

    def autotools_host(self) -> str:
        """``--host=`` for a GNU configure script."""
        return f"--host={self.autotools_triple}"

    def meson_cross_file(self, path: Path, cc: str, cxx: str, ar: str) -> Path:
        """Write a Meson cross file for the target, compiling with the wrappers ``cc``/``cxx``."""
        family = {"aarch64": "aarch64", "arm64": "aarch64", "x86_64": "x86_64"}.get(self.arch)
        if family is None:
            if self.arch.startswith(("arm", "thumb")):
                family = "arm"
            elif len(self.arch) == 4 and self.arch.startswith("i") and self.arch.endswith("86"):
                family = "x86"
            else:
                family = self.arch.rstrip("el") if self.arch.startswith("riscv") else self.arch
        system = "linux" if self.linux else "none"
        emulator = self.emulator()
        wrapper = f"exe_wrapper = {emulator!r}\n" if emulator else ""  # meson test runs the tests through it
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            "# optgym: the target's cross file\n"
            f"[binaries]\nc = {cc!r}\ncpp = {cxx!r}\nar = {ar!r}\n{wrapper}\n"
            f"[properties]\nneeds_exe_wrapper = true\n\n"
            f"[host_machine]\nsystem = {system!r}\ncpu_family = {family!r}\ncpu = {self.arch!r}\n"
            "endian = 'little'\n"
        )
        return path


@dataclass(frozen=True)
class BareMetalRuntime:
    """What a bare-metal program links against: picolibc's start file and libraries for one multilib, that
    multilib's ``libgcc.a`` (64-bit division, soft float…) and a linker script."""

    multilib: str
    libdir: Path
    libgcc: Path
    script: Path = CORTEX_M_SCRIPT
    stdio: Path | None = None  # SEMIHOST_STDIO compiled for the multilib; None: libsemihost's one console

    @property
    def start_file(self) -> Path:
        """picolibc's semihosting start file, ``crt0-semihost.o``, where the multilib has it (else ``crt0.o``): it
        takes ``main``'s arguments from the semihosting command line and hands ``main``'s return to ``exit``, so a
        program run under QEMU (:mod:`optgym.corpus.qemu_system`) gets its arguments and its exit code reaches
        the host; plain ``crt0.o`` calls ``main`` with none and spins when it returns."""
        semihost = self.libdir / "crt0-semihost.o"
        return semihost if semihost.is_file() else self.libdir / "crt0.o"

    @property
    def link_flags(self) -> tuple[str, ...]:
        """The link's flags: nothing of clang's own bare-metal runtime (``-nostdlib``: it has none installed),
        picolibc's start file, ``libc`` and its semihosting I/O, ``libgcc``, and the script. ``-z norelro``: the
        TLS template in RAM cannot sit next to the read-only data in flash, and relro means nothing without an OS."""
        stdio = (str(self.stdio),) if self.stdio else ()  # before -lc -lsemihost: its streams are the ones linked
        return ("-nostdlib", "-Wl,-z,norelro", "-T", str(self.script), str(self.start_file), *stdio,
                f"-L{self.libdir}", "-lc", "-lsemihost", str(self.libgcc))  # fmt: skip


def arm_march(arch: str) -> str | None:
    """GCC's ``-march=`` for a triple's ARM architecture (``thumbv7em`` → ``armv7e-m``, ``thumbv8m.main`` →
    ``armv8-m.main``), ``None`` for anything else."""
    m = re.fullmatch(r"(?:arm|thumb)v(\d+(?:\.\d+)?)(e?)([amr]?)((?:\.\w+)?)(?:eb)?", arch)
    if m is None:
        return None
    version, e, profile, rest = m.groups()
    return f"armv{version}{e}-{profile}{rest}" if profile else f"armv{version}{e}{rest}"


def multilib_args(target: Target) -> list[str]:
    """The target's multilib-choosing flags, as GCC spells them: its ``-mcpu``/``-march``/``-mfpu``/
    ``-mfloat-abi``/``-mthumb``/``-marm``, with the triple's architecture when no CPU or architecture is named
    and a hard-float ABI for an ``…eabihf`` triple (clang's defaults, which GCC does not infer)."""
    args = [f for f in target.flags if f.startswith(MULTILIB_FLAG_PREFIXES) or f in ("-mthumb", "-marm")]
    if not any(a.startswith(("-mcpu=", "-march=")) for a in args) and (march := arm_march(target.arch)):
        args.append(f"-march={march}")
    if target.arch.startswith("thumb") and "-marm" not in args and "-mthumb" not in args:
        args.append("-mthumb")
    if target.triple.endswith("eabihf") and not any(a.startswith("-mfloat-abi=") for a in args):
        args.append("-mfloat-abi=hard")
    return args


@functools.cache
def bare_metal_runtime(target: Target, picolibc: Path = PICOLIBC_ARM) -> BareMetalRuntime | None:
    """The runtime a bare-metal ARM M-profile target's programs link against, or ``None`` (not bare metal, not a
    Cortex-M, no ``arm-none-eabi-gcc``, or no picolibc multilib for the flags).

    The multilib is the one GCC picks for the target's flags (``-print-multi-directory``; clang-22's own answer is
    ``.``: it has no multilib layout for picolibc): ``thumb/v7e-m/nofp`` for ``-mcpu=cortex-m4 -mthumb``,
    ``thumb/v7e-m+fp/hard`` with ``-mfloat-abi=hard``. The script is a Cortex-M's (vector table at 0), so only
    M-profile multilibs (``v6-m``, ``v7-m``, ``v7e-m``, ``v8-m.*``, ``v8.1-m.*``) qualify."""
    if not target.bare_metal or not target.arch.startswith(("arm", "thumb")):
        return None
    gcc = shutil.which(ARM_GCC)
    if gcc is None:
        return None
    args = multilib_args(target)
    answers = []
    for query in ("-print-multi-directory", "-print-libgcc-file-name"):
        proc = subprocess.run([gcc, *args, query], capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            return None
        answers.append(proc.stdout.strip())
    multilib, libgcc = answers[0], Path(answers[1])
    libdir = picolibc / "lib" / multilib
    if not re.search(r"v\d+(\.\d+)?e?-m", multilib) or not (libdir / "crt0.o").is_file():
        return None
    if not (libdir / "libc.a").is_file() or not libgcc.is_absolute() or not libgcc.is_file():
        return None
    return BareMetalRuntime(multilib, libdir, libgcc, stdio=_host_stdio(target, args, picolibc))


def _host_stdio(target: Target, multilib_flags: Sequence[str], picolibc: Path) -> Path | None:
    """:data:`SEMIHOST_STDIO` compiled for the target's multilib, once per source, compiler and flags (in optgym's
    cache directory); ``None`` if it does not compile, and the programs keep libsemihost's console."""
    from optgym.errors import ToolchainError
    from optgym.files import atomic_write_bytes, cache_root
    from optgym.toolchain import find_toolchain

    try:
        toolchain = find_toolchain()
    except ToolchainError:
        return None
    args = [f"--target={target.triple}", *multilib_flags, "-Oz", "-isystem", str(picolibc / "include")]
    key = hashlib.sha256("\0".join([SEMIHOST_STDIO.read_text(), toolchain.identity, *args]).encode()).hexdigest()
    cached = cache_root() / "baremetal" / f"semihost-stdio-{key[:16]}.o"
    if cached.is_file():
        return cached
    proc = subprocess.run([str(toolchain.clang), *args, "-c", str(SEMIHOST_STDIO), "-o", "-"], capture_output=True,
                          timeout=120)  # fmt: skip
    if proc.returncode != 0:
        return None
    atomic_write_bytes(cached, proc.stdout)
    return cached


def module_triple(cc1_args: Sequence[str]) -> str | None:
    """The target triple a module was compiled for: its ``-cc1`` command's ``-triple`` (``None`` when absent)."""
    for i, arg in enumerate(cc1_args):
        if arg == "-triple" and i + 1 < len(cc1_args):
            return cc1_args[i + 1]
    return None
