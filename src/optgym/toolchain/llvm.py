"""Finding clang-22 and its tools, and checking that the MLGO interactive hooks are there.

Search order: ``$OPTGYM_LLVM_DIR`` (a directory holding ``clang``), ``/usr/lib/llvm-22/bin``
(Debian's layout), then ``clang-22`` and ``clang`` on ``PATH``. clang ≤ 21 is refused: clang-19
writes ``inlining_default`` into the wrong feature slot, and the channel flags differ before 22.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from optgym.errors import ToolchainError
from optgym.files import cache_root

MIN_MAJOR = 22
DEBIAN_DIR = Path("/usr/lib/llvm-22/bin")
INSTALL_HINT = "install it with `sudo apt-get install clang-22 llvm-22 lld-22` (Debian bookworm-security)"

#: Stands for a channel's FIFO base when clang is asked whether it takes a hook (a path that never exists:
#: probing clang opens nothing).
CHANNEL_BASE = "/nonexistent"


@dataclass(frozen=True)
class Hook:
    """One MLGO interactive hook of clang: the ``-mllvm`` options that hand a decision to a host over a FIFO
    channel. Each decision problem declares its own (``Problem.hook``, in the problem's file): this layer
    knows no problem, it only checks that a clang takes a hook (:meth:`Toolchain.accepts`,
    :func:`find_toolchain`) and puts a channel in (:meth:`flags`)."""

    name: str  # what ``optgym doctor`` and errors call it: "inliner"
    options: tuple[str, ...]  # the advisor's own options: ("-enable-ml-inliner=release", …)
    channel: str  # the option naming the channel's FIFO base: "-inliner-interactive-channel-base"

    def mllvm(self, base: str) -> tuple[str, ...]:
        """The ``-mllvm`` options with the channel at ``base`` (``base.in``/``base.out``)."""
        return (*self.options, f"{self.channel}={base}")

    def flags(self, base: str) -> list[str]:
        """The driver flags that route the decision over the channel at ``base``, each option behind ``-mllvm``."""
        return [arg for option in self.mllvm(base) for arg in ("-mllvm", option)]


def for_linker(flags: Sequence[str]) -> list[str]:
    """Driver flags of a compile made flags of a link: each ``-mllvm OPTION`` becomes ``-Wl,-mllvm,OPTION``, which
    the driver hands to lld, whose in-process ThinLTO backends take it (an option with a comma cannot pass)."""
    items = list(flags)
    if len(items) % 2 or any(flag != "-mllvm" for flag in items[::2]):
        raise ValueError(f"only -mllvm options reach a link's backends, not {items}")
    if any("," in option for option in items[1::2]):
        raise ValueError(f"-Wl splits at commas: {items}")
    return [f"-Wl,-mllvm,{option}" for option in items[1::2]]


@dataclass(frozen=True)
class Toolchain:
    """A checked clang ≥ 22 and the directory of its LLVM tools."""

    clang: Path
    version: str  # "22.1.8"
    banner: str  # first line of `clang --version`, e.g. "Debian clang version 22.1.8 (1~deb12u1)"

    @property
    def bin_dir(self) -> Path:
        return self.clang.parent

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    @property
    def identity(self) -> str:
        """What cache keys use: the banner plus a digest of the binary's size and mtime."""
        st = self.clang.stat()
        return f"{self.banner} [{hashlib.sha256(f'{st.st_size}:{st.st_mtime_ns}'.encode()).hexdigest()[:12]}]"

    def tool(self, name: str) -> Path:
        """An LLVM tool next to clang (``llvm-size``, ``llvm-objcopy``…), else ``name-22`` on PATH."""
        for candidate in (self.bin_dir / name, shutil.which(f"{name}-{self.major}"), shutil.which(name)):
            if candidate and Path(candidate).exists():
                return Path(candidate)
        raise ToolchainError(f"{name} not found next to {self.clang} nor on PATH; {INSTALL_HINT}")

    def accepts(self, hook: Hook) -> bool:
        """Whether this clang takes ``hook``'s options (remembered per binary: see ``_accepts_options``)."""
        return _accepts_options(self.clang, hook.mllvm(CHANNEL_BASE))


def _candidates() -> list[Path]:
    found: list[Path] = []
    if env_dir := os.environ.get("OPTGYM_LLVM_DIR"):
        found.append(Path(env_dir) / "clang")
    found.append(DEBIAN_DIR / "clang")
    for name in ("clang-22", "clang"):
        if path := shutil.which(name):
            found.append(Path(path))
    return found


def parse_version(banner: str) -> str:
    match = re.search(r"clang version (\d+)\.(\d+)\.(\d+)", banner)
    if not match:
        raise ToolchainError(f"cannot read a clang version from {banner!r}")
    return ".".join(match.groups())


# -- what a clang binary said about itself, remembered across processes ---------------------------
#
# Checking a clang is two runs of it (``--version`` and the hooks), ~40 ms of CPU and 50-100 ms of wall
# time on a loaded machine. Every process that compiles pays it once; optgym-cc's policy server pays it
# at the start of every build, which the build's first compiles wait for. The answers depend only on
# the binary, so they are kept in ``$OPTGYM_CACHE_DIR/toolchains/`` keyed by the binary's path, size,
# inode and times: a clang upgraded or replaced in place is probed again.


def _probe_cache_file(clang: Path) -> Path | None:
    try:
        st = clang.stat()
        real = clang.resolve()
    except OSError:
        return None
    key = f"{real}\0{st.st_size}\0{st.st_ino}\0{st.st_mtime_ns}\0{st.st_ctime_ns}"
    return cache_root() / "toolchains" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def _probe_cache_read(clang: Path) -> dict:
    path = _probe_cache_file(clang)
    try:
        data = json.loads(path.read_text()) if path else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _probe_cache_update(clang: Path, **entries: object) -> None:
    """Best effort: a cache that cannot be written only means probing again next time."""
    path = _probe_cache_file(clang)
    if path is None:
        return
    data = _probe_cache_read(clang) | entries
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".probe-")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)


@functools.cache
def _probe(clang: Path) -> Toolchain:
    banner = _probe_cache_read(clang).get("banner")
    if not isinstance(banner, str):
        try:
            out = subprocess.run([str(clang), "--version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ToolchainError(f"cannot run {clang} --version: {e}") from None
        banner = out.stdout.splitlines()[0] if out.stdout else ""
        if out.returncode == 0 and banner:
            _probe_cache_update(clang, banner=banner)
    toolchain = Toolchain(clang=clang, version=parse_version(banner), banner=banner)
    if toolchain.major < MIN_MAJOR:
        raise ToolchainError(
            f"{clang} is clang {toolchain.version}; optgym needs clang ≥ {MIN_MAJOR} "
            f"(clang ≤ 21 lacks the interactive channel as optgym drives it, and clang-19 writes "
            f"`inlining_default` into the wrong feature slot); {INSTALL_HINT}"
        )
    return toolchain


def find_toolchain(require_hooks: Iterable[Hook] = ()) -> Toolchain:
    """The first clang in the search order; it must be ≥ 22 and take ``require_hooks`` (the decision problems'
    own: ``find_toolchain((problem.hook,))``)."""
    require_hooks = tuple(require_hooks)
    candidates = _candidates()
    explicit = os.environ.get("OPTGYM_LLVM_DIR")
    for clang in candidates:
        if not clang.exists():
            if explicit and clang == Path(explicit) / "clang":
                raise ToolchainError(f"OPTGYM_LLVM_DIR={explicit} has no clang in it")
            continue
        toolchain = _probe(clang.resolve() if clang.is_symlink() else clang)
        missing = sorted({hook.name for hook in require_hooks if not toolchain.accepts(hook)})
        if missing:
            raise ToolchainError(
                f"{toolchain.clang} ({toolchain.banner}) lacks the MLGO interactive hooks {missing}; "
                f"a stock Debian clang-22 has them"
            )
        return toolchain
    raise ToolchainError(f"clang-22 not found (looked at $OPTGYM_LLVM_DIR, {DEBIAN_DIR}, PATH); {INSTALL_HINT}")


@functools.cache
def _accepts_options(clang: Path, options: tuple[str, ...]) -> bool:
    """Whether clang parses these ``-mllvm`` options (a syntax-only compile of an empty file)."""
    key = "options:" + " ".join(options)
    cached = _probe_cache_read(clang).get(key)
    if isinstance(cached, bool):
        return cached
    args = [str(clang), "-fsyntax-only", "-x", "c", "/dev/null"]
    for opt in options:
        args += ["-mllvm", opt]
    try:
        accepted = subprocess.run(args, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False  # not remembered: it may work next time
    _probe_cache_update(clang, **{key: accepted})
    return accepted
