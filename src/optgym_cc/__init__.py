"""``optgym-cc`` / ``optgym-c++``: drop-in ``CC``/``CXX`` whose ``-Oz``/``-Os`` compiles a policy decides.

The names a build runs are ``scripts/optgym-cc``, a ``/bin/sh`` front door that execs clang-22 itself for the
steps this launcher would pass through unchanged (a ThinLTO build's compile steps, other ``-O`` levels, links
without LTO), since Python's start is ~10 ms a step, and hands every other step here (:func:`main`).

This module lives outside the ``optgym`` package on purpose: it runs once per step it is handed,
so it imports only the standard library's cheapest modules (no numpy, no gymnasium) and either
``exec``s clang-22 directly — linking, preprocessing, other optimization levels, ``--version``,
``OPTGYM_POLICY=heuristic`` — or hands the compile to the policy's server
(:mod:`optgym.serve.server`, started on first use, shared by every compile of a parallel build,
gone when idle) and exits with clang's status. stdout, stderr and the outputs are clang's own; a
failure of the policy or the server falls back to a plain compile with one warning line on stderr,
unless ``OPTGYM_STRICT=1`` makes it an error.

Three decisions of a compile can be served, each by its own policy over its own channel: inlining
(``OPTGYM_POLICY``), and register allocation's eviction (``OPTGYM_EVICT_POLICY``) and order of live
ranges (``OPTGYM_PRIORITY_POLICY``). A compile whose policies are all ``heuristic`` is clang's own and
never reaches the server.

Policies are per target: a compile's policy is the one shipped for the target it compiles for (``--target=T``,
``-target T``, a triple-prefixed name such as ``aarch64-linux-gnu-optgym-cc``, else this machine's), and the
shipped policies are x86-64's. A target may ship a portfolio of pass options for C
(``PRETRAINED_DIR/<arch or family>/portfolio-c.json``, :func:`target_portfolio`): its C compiles are then the
portfolio's, clang deciding inlining and allocation, beside any policy shipped for the target
(:func:`compile_plan`). A compile for a target with neither is clang's own, and the build is told once
(:func:`note_once`); see docs/targets.md.

Environment: ``OPTGYM_POLICY`` (a policy spec: ``heuristic``, ``never``, a policy or run directory…;
default ``pretrained``, the policy shipped in the package, or ``heuristic`` where none is shipped),
``OPTGYM_EVICT_POLICY`` and ``OPTGYM_PRIORITY_POLICY`` (the same for eviction and allocation priority:
``heuristic`` is clang's default advisor),
``OPTGYM_SERVE_OPT`` (the ``-O`` levels served, default ``z,s``), ``OPTGYM_STRICT``, ``OPTGYM_GUARD=1``
(clang's own compile runs beside the policy's and the smaller object is kept: no object larger than
clang's, for a second compile's CPU), ``OPTGYM_GUARD_BELOW=N`` (the same only for objects under N bytes of
text, compiled again after the policy's; none by default, 2048 suggested),
``OPTGYM_CANDIDATES=N`` (C compiled with the shipped policies: the shipped portfolio's first ``N`` ways, the
smallest object kept; default: the portfolio's ``default_candidates`` — one for the shipped one, its pass
options alone; ``3``: those, the portfolio's allocator scorers with them, and clang's own; ``0``: the policies
alone), ``OPTGYM_TIMEOUT`` (seconds of compiler time a served compile may take, default 600),
``OPTGYM_PORTFOLIO`` (another portfolio file),
``OPTGYM_SERVE_LTO=1`` (serve ``-flto`` compile steps too; by default they pass through),
``OPTGYM_LTO_POLICY``, ``OPTGYM_LTO_EVICT_POLICY``, ``OPTGYM_LTO_PRIORITY_POLICY`` (the policies of a ThinLTO
link's backends, :mod:`optgym_cc.thinlto`; ``pretrained`` is the ThinLTO policy shipped for the link's target, or
``heuristic`` where none is shipped; inlining defaults to ``pretrained``, the allocator to ``heuristic``),
``OPTGYM_VERBOSE=1`` (a ThinLTO link says how many backends and
decisions were served),
``OPTGYM_LLVM_DIR``, ``OPTGYM_SERVER_IDLE`` (seconds, default 60).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing's own costs an import on every step; mypy reads this name the same way
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

# Only `os` and `sys` at import: a pass-through call (linking, -O2, --version…) must cost no more than
# the interpreter's start. Serving imports only C modules that load in ~0.2 ms each: `_socket`, not
# `socket` (6 ms: enum, selectors…); `marshal` (built in), not `json` (6 ms: re…); `_sha256`/`_sha2`,
# not `hashlib` (2.4 ms: OpenSSL). Measured with `python -X importtime`; at one launcher per compile,
# `socket` + `json` + `hashlib` were ~14 ms of CPU per compile — a tenth of a build's extra CPU.

#: Bumped whenever the launcher↔server messages change: part of the server's socket name, so a
#: launcher never talks to a server of another version that is still idling.
PROTOCOL = "4"

PRETRAINED_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "optgym", "policies", "pretrained")
#: The code at both ends of the socket: a server started by other code (an upgrade, an edit of an editable
#: install) is not asked, since its replies could mean something else. Their files' identity keys the socket.
SERVED_BY = (__file__, os.path.join(os.path.dirname(os.path.dirname(__file__)), "optgym", "serve", "server.py"))
#: The decisions a launcher can serve: (problem, the environment variable naming its policy, the file of the
#: policy shipped for it inside the optgym package). Each problem declares these in its own file
#: (``serve_variable``, ``pretrained``); this is :func:`optgym.serve.server.channels` written out, in the
#: registry's order, because the launcher imports nothing of optgym — tests/test_problem_registry.py fails
#: until a new servable problem's row is added here.
CHANNELS = (
    ("inline-size", "OPTGYM_POLICY", os.path.join(PRETRAINED_DIR, "inline-size.onnx")),
    ("regalloc-evict", "OPTGYM_EVICT_POLICY", os.path.join(PRETRAINED_DIR, "regalloc-evict.onnx")),
    ("regalloc-priority", "OPTGYM_PRIORITY_POLICY", os.path.join(PRETRAINED_DIR, "regalloc-priority.onnx")),
)
#: The shipped inliner policy (``--policy pretrained``).
PRETRAINED = CHANNELS[0][2]


def default_policy(shipped: str = PRETRAINED) -> str:
    """``pretrained`` when the package ships the policy (one ``stat``), else clang's own ``heuristic``."""
    return "pretrained" if os.path.isfile(shipped) else "heuristic"


# --- the compile's target --------------------------------------------------------------------------------------
# A policy learned its decisions on one target's code and cost model: the shipped ones on x86-64. So the policy
# of a compile is the one shipped for *its* target (docs/targets.md): PRETRAINED_DIR/<arch>/<problem>.onnx, else
# PRETRAINED_DIR/<family>/<problem>.onnx (``thumbv7em``, then ``arm``), and for x86-64, whose policies came
# first, PRETRAINED_DIR/<problem>.onnx. Shipping a target's policy is dropping its file in; a target with none
# gets clang's own decisions.

#: The family whose policies live in PRETRAINED_DIR itself.
SHIPPED_FAMILY = "x86_64"
#: What a target with no shipped policy prints, once per target per build (:func:`note_once`). Its words stay
#: clear of CMake's and autoconf's flag-check patterns ("option", "unknown", "not supported", "warning"): the first
#: compile of a build is often such a check, and its stderr decides whether a flag is taken.
NO_POLICY_NOTE = (
    "optgym-cc: note: optgym ships no {what}policy for {family} (target {target}): these compiles keep clang's "
    "own decisions; OPTGYM_POLICY=PATH serves one (docs/targets.md)\n"
)
#: A build: compiles of one session with no gap this long between two of them for the target (:func:`note_once`).
NOTE_IDLE_SECONDS = 600
_DRIVER_NAMES = ("optgym-cc", "optgym-c++")


def arch_family(arch: str) -> str:
    """The family of an architecture: policies for one family fit all its spellings (``arm64`` is ``aarch64``,
    ``thumbv7em`` is ``arm``; ``i686`` is ``x86``, not ``x86_64``: another register file and ABI)."""
    if arch in ("x86_64", "amd64", "x86_64h"):
        return "x86_64"
    if len(arch) == 4 and arch[0] == "i" and arch[1] in "3456" and arch[2:] == "86":
        return "x86"
    if arch.startswith(("aarch64", "arm64")):
        return "aarch64"
    if arch.startswith(("arm", "thumb")):
        return "arm"
    if arch.startswith("riscv"):
        return arch[:7]  # riscv32 / riscv64
    return arch


def driver_target(program: str) -> str | None:
    """The triple a driver's name carries (``aarch64-linux-gnu-optgym-cc``, as clang's own
    ``aarch64-linux-gnu-clang``), else ``None``."""
    name = os.path.basename(program)
    for driver in _DRIVER_NAMES:
        if name.endswith("-" + driver):
            return name[: -len(driver) - 1] or None
    return None


def explicit_target(args: list[str]) -> str | None:
    """The triple named on the command line: the last ``--target=T`` or ``-target T`` (CMake's
    ``CMAKE_<LANG>_COMPILER_TARGET`` becomes ``--target=T``), else ``None``."""
    target = None
    for i, arg in enumerate(args):
        if arg.startswith("--target="):
            target = arg[len("--target=") :]
        elif arg == "-target" and i + 1 < len(args):
            target = args[i + 1]
    return target


def compile_target(args: list[str], program: str = "") -> tuple[str, str]:
    """``(triple or arch as named, family)`` of a compile: the command line's target, else the driver name's,
    else this machine's; ``-m32``/``-m64`` switch x86 and x86-64 as they do in clang (the last wins)."""
    target = explicit_target(args) or driver_target(program) or os.uname().machine
    arch = target.split("-", 1)[0]
    family = arch_family(arch)
    for arg in args:
        if arg == "-m32" and family == "x86_64":
            family = "x86"
        elif arg in ("-m64", "-mx32") and family == "x86":
            family = "x86_64"
    return target, family


def triple_target(triple: str | None) -> tuple[str, str]:
    """:func:`compile_target` of a compile for ``triple`` (a build's ``--target``; ``None``: this machine's)."""
    return compile_target([f"--target={triple}"] if triple else [])


def shipped_policy(name: str, target: tuple[str, str]) -> str | None:
    """The file of the policy shipped as ``name`` (``inline-size.onnx``…) for ``target`` (:func:`compile_target`),
    else ``None``: the most specific directory first (see above)."""
    arch, family = target[0].split("-", 1)[0], target[1]
    dirs = [os.path.join(PRETRAINED_DIR, arch)] if arch != family and arch_family(arch) == family else []
    dirs.append(os.path.join(PRETRAINED_DIR, family))
    if family == SHIPPED_FAMILY:
        dirs.append(PRETRAINED_DIR)
    for directory in dirs:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    return None


def target_policies(target: tuple[str, str]) -> tuple[list[tuple[str, str]], list[str]]:
    """``(problem, policy spec)`` of every decision a compile for ``target`` serves — those not left to clang —
    and the problems whose ``pretrained`` policy (asked for, or the default) this target has none of.

    ``pretrained`` stays ``pretrained`` for x86-64's own files (the server and the shipped portfolio know them)
    and becomes the file's path for another target's; any other spec is the build's choice and stays as it is."""
    chosen: list[tuple[str, str]] = []
    missing: list[str] = []
    for problem, variable, shipped in CHANNELS:
        spec = os.environ.get(variable) or "pretrained"
        if spec == "pretrained":
            path = shipped_policy(os.path.basename(shipped), target)
            if path is None:
                if target[1] != SHIPPED_FAMILY:  # the host family without its file: a package that ships none
                    missing.append(problem)
                continue
            if path != shipped:
                spec = path
        if spec != "heuristic":
            chosen.append((problem, spec))
    return chosen, missing


#: The file of a target's portfolio for C (:mod:`optgym.policies.portfolio`): pass options chosen on that target's
#: training modules (``python -m maintainer.portfolio choose --allocator clang``), beside its policies.
PORTFOLIO = "portfolio-c.json"


def target_portfolio(target: tuple[str, str], args: list[str], driver: str) -> str | None:
    """The portfolio of a C compile for ``target`` (:func:`compile_plan` says when it is served): the build's
    (``OPTGYM_PORTFOLIO``), else the one shipped for the target; none with ``OPTGYM_CANDIDATES=0``, and ``None``
    for the host family, whose portfolio the server knows as its default."""
    if target[1] == SHIPPED_FAMILY or os.environ.get("OPTGYM_CANDIDATES") == "0" or not compiles_c(args, driver):
        return None
    return os.environ.get("OPTGYM_PORTFOLIO") or shipped_policy(PORTFOLIO, target)


def compile_plan(
    target: tuple[str, str], args: list[str], driver: str, policies: list[tuple[str, str]], missing: list[str]
) -> tuple[list[tuple[str, str]], list[str], str | None]:
    """``(policies, missing, portfolio)`` of a compile that is served, from its target's (:func:`target_policies`).

    A C compile of a target that ships a portfolio for C is that portfolio's: the server compiles its candidates
    with clang's own decisions (the inliner's ``heuristic`` names the server; no channel is opened). So it is even
    when the target also ships policies: a target's file names the language it was chosen for, and its
    ``portfolio-c.json`` is measured against clang's inlining, not against a policy trained on its C++. A policy
    the build names itself (``OPTGYM_POLICY`` and the like, anything but a shipped file) takes the C compile."""
    if not all(is_shipped(spec) for _, spec in policies):
        return policies, missing, None
    portfolio = target_portfolio(target, args, driver)
    if portfolio:
        return [(CHANNELS[0][0], "heuristic")], [], portfolio
    return policies, missing, None


def is_shipped(spec: str) -> bool:
    """Whether a policy spec is a file shipped for a target (``PRETRAINED_DIR/<arch or family>/…``)."""
    return os.path.dirname(os.path.dirname(spec)) == PRETRAINED_DIR


def compiles_c(args: list[str], driver: str) -> bool:
    """Whether a compile is of C: clang's C driver on ``-x c`` (the last ``-x`` wins), else on ``.c`` files.

    A launcher's first look, importing nothing of optgym: the server decides the language again
    (:func:`optgym.toolchain.language.driver_language`) and compiles plainly what its portfolio does not take.
    Here it keeps C++ compiles of a target away from the server and gives them the note."""
    if driver != "clang":
        return False
    language = None
    for i, arg in enumerate(args):
        if arg == "-x" and i + 1 < len(args):
            language = args[i + 1]
        elif arg.startswith("-x") and len(arg) > 2:
            language = arg[2:]
    if language is not None:
        return language == "c"
    sources = operands(args)[0]
    return bool(sources) and all(source.endswith(".c") for source in sources)


def chosen_policies(target: tuple[str, str] | None = None) -> list[tuple[str, str]]:
    """``(problem, policy spec)`` of every decision a compile for ``target`` (default: this machine's) serves."""
    return target_policies(target or compile_target([]))[0]


def configure_probe(args: list[str]) -> bool:
    """Whether a compile is a build system's check (CMake's try-compiles in ``CMakeFiles/``, autoconf's
    ``conftest.c``, Meson's ``meson-private/``): its stderr is captured into a log nobody reads, or read as
    the flag's verdict."""
    places = [os.getcwd(), *operands(args)[0]]
    return any(
        "/CMakeFiles/" in place or "meson-private" in place or os.path.basename(place).startswith("conftest")
        for place in places
    )


def note_once(family: str, target: str, missing: list[str], args: list[str] | None = None) -> None:
    """Say on stderr, once per target family per build, that its compiles keep clang's decisions.

    One line per compile would bury a build's log (a thousand compiles, a thousand notes); never saying it would
    leave a user believing the policy decided. A *build* is taken as the compiles of one session (``getsid``:
    one terminal, one CI job) for the family without a ten-minute gap: a marker file in optgym's runtime
    directory, touched by every such compile, holds the time of the last one. A configure check (``args``:
    :func:`configure_probe`) says nothing and leaves the note to the build's first real compile, whose output
    the user sees. ``OPTGYM_VERBOSE=1`` notes every compile. Best effort: a runtime directory that cannot be
    written costs the note, never the compile."""
    what = "/".join(missing) + " " if len(missing) < len(CHANNELS) else ""
    line = NO_POLICY_NOTE.format(what=what, family=family, target=target)
    if args is not None and configure_probe(args):
        return
    if os.environ.get("OPTGYM_VERBOSE") != "1":
        try:
            marker = os.path.join(_runtime_root(), f"note-{family}-{os.getsid(0)}")
            try:
                last = os.stat(marker).st_mtime
            except FileNotFoundError:
                last = None
            if last is not None:
                import time

                os.utime(marker)
                if time.time() - last < NOTE_IDLE_SECONDS:
                    return
            else:
                try:
                    os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
                except FileExistsError:  # a parallel compile of the same build got there first and says it
                    return
        except OSError:
            pass
    sys.stderr.write(line)
    sys.stderr.flush()


SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".c++", ".C", ".i", ".ii")
#: Options whose value is the next argument (so it is not an input file).
TAKES_VALUE = frozenset(
    [
        "-o", "-x", "-I", "-D", "-U", "-include", "-imacros", "-isystem", "-idirafter", "-iquote", "-iprefix",
        "-iwithprefix", "-isysroot", "--sysroot", "-MF", "-MT", "-MQ", "-Xclang", "-mllvm", "-Xlinker",
        "-Xassembler", "-Xpreprocessor", "-target", "-arch", "-L", "-l", "-z", "-T", "-u", "-e", "-resource-dir",
        "-gcc-toolchain", "-working-directory", "-main-file-name", "-ivfsoverlay",
    ]
)  # fmt: skip
#: Any of these means the invocation is not a plain compile to an object: pass it straight through.
NOT_SERVED = frozenset(["-E", "-S", "-M", "-MM", "-###", "--version", "-fsyntax-only", "-emit-llvm", "-cc1", "-"])


def _clang(driver: str) -> str:
    """clang-22 (or another tool of LLVM 22: ``driver`` names it) as the toolchain layer finds it (kept in step
    with optgym.toolchain.llvm)."""
    candidates = []
    if env_dir := os.environ.get("OPTGYM_LLVM_DIR"):
        candidates.append(os.path.join(env_dir, driver))
    candidates.append(os.path.join("/usr/lib/llvm-22/bin", driver))
    for path in candidates:
        if os.access(path, os.X_OK):
            return path
    import shutil

    for found in (shutil.which(f"{driver}-22"), shutil.which(driver)):
        if found:
            return found
    sys.stderr.write(f"optgym-cc: {driver}-22 not found; install clang-22 (apt-get install clang-22)\n")
    sys.exit(127)


def lto(args: list[str]) -> str | None:
    """The LTO option in force (``-flto``, ``-flto=thin``…; the last of those and ``-fno-lto`` wins), else ``None``."""
    mode = None
    for arg in args:
        if arg == "-flto" or arg.startswith("-flto="):
            mode = arg
        elif arg == "-fno-lto":
            mode = None
    return mode


def served(args: list[str], levels: tuple[str, ...], serve_lto: bool = False) -> bool:
    """Whether this invocation compiles exactly one C/C++ source to an object at a served -O level.

    An LTO compile step writes bitcode whose inlining the link's own inliner goes over again; the
    shipped policy learned per-object decisions, and under ThinLTO they do not carry over (measured: a
    ThinLTO woff2 5.7 % larger in linked ``.text``), so such steps pass through unless ``serve_lto``
    (``OPTGYM_SERVE_LTO=1``) asks for them. The link's backends are served instead (:mod:`optgym_cc.thinlto`)."""
    if "-c" not in args or any(a in NOT_SERVED for a in args) or (not serve_lto and lto(args)):
        return False
    opt = [a for a in args if a.startswith("-O")]
    if not opt or opt[-1][2:] not in levels:
        return False
    inputs, _ = operands(args)
    return len(inputs) == 1 and inputs[0].endswith(SOURCE_SUFFIXES)


def may_serve(args: list[str], environ: Mapping[str, str] = os.environ) -> bool:
    """Whether optgym could serve this step at all, before any policy is looked at: a link step of an LTO build
    (its backends, :mod:`optgym_cc.thinlto`) or a :func:`served` compile at ``OPTGYM_SERVE_OPT``'s levels. Every
    other step is clang's own; the front door (``scripts/optgym-cc``) runs clang itself only for steps where
    this is ``False``, and tests/test_front.py holds it to that."""
    if "-c" not in args and lto(args):
        return True
    levels = tuple(environ.get("OPTGYM_SERVE_OPT", "z,s").split(","))
    return served(args, levels, environ.get("OPTGYM_SERVE_LTO") == "1")


def joined_output(arg: str) -> str | None:
    """FILE of ``-oFILE`` (``-o`` joined to its value; not ``-objcmt-…`` and the like), else ``None``."""
    return arg[2:] if arg.startswith("-o") and len(arg) > 2 and not arg.startswith("-obj") else None


def operands(args: list[str]) -> tuple[list[str], str | None]:
    """The input files of a driver command line and its output (the last ``-o FILE`` or ``-oFILE``, else
    ``None``): what a served compile reads and writes."""
    inputs, output, option = [], None, None
    for arg in args:
        if option is not None:
            output, option = (arg if option == "-o" else output), None
        elif arg in TAKES_VALUE:
            option = arg
        elif joined := joined_output(arg):
            output = joined
        elif not arg.startswith("-"):
            inputs.append(arg)
    return inputs, output


def _runtime_root() -> str:
    """optgym's private runtime directory (kept in step with optgym.toolchain.process.runtime_root)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    root = os.path.join(base, "optgym") if base else os.path.join("/tmp", f"optgym-{os.getuid()}")
    os.makedirs(root, mode=0o700, exist_ok=True)
    return root


def _cache_root() -> str:
    """optgym's cache directory, ``$OPTGYM_CACHE_DIR`` else ``~/.cache/optgym`` (kept in step with
    optgym.files.cache_root, which the launcher may not import)."""
    return os.environ.get("OPTGYM_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "optgym")


def _sha256_hex(data: bytes) -> str:
    try:  # CPython's own sha256, without hashlib's OpenSSL load
        from _sha256 import sha256  # 3.11
    except ImportError:
        try:
            from _sha2 import sha256  # 3.12+
        except ImportError:
            from hashlib import sha256
    return sha256(data).hexdigest()


def _identity(paths: Sequence[str]) -> list[str]:
    """Each existing file's real path, inode and modification time: it changes when the file is replaced."""
    ident: list[str] = []
    for path in paths:
        if os.path.exists(path):
            st = os.stat(path)
            ident += [os.path.realpath(path), str(st.st_ino), str(st.st_mtime_ns)]
    return ident


def _server_socket(policies: list[tuple[str, str]], clang: str) -> str:
    """The socket of the server for these policies, toolchain, interpreter, protocol and code (:data:`SERVED_BY`).

    Keyed by clang's *directory*, not the driver: ``optgym-cc`` and ``optgym-c++`` of one build share
    one server (it runs whichever driver the request names), so a C/C++ project loads the policy once.
    The interpreter is part of the key, so both ends speak the same ``marshal``.
    """
    ident = [PROTOCOL, os.path.dirname(clang), sys.executable, *_identity(SERVED_BY)]
    shipped = {problem: path for problem, _, path in CHANNELS}
    for problem, spec in policies:
        ident += [problem, spec]
        path = shipped[problem] if spec == "pretrained" else spec  # a replaced shipped file gets a new server too
        ident += _identity([path])
    return os.path.join(_runtime_root(), f"serve-{_sha256_hex(chr(0).join(ident).encode())[:16]}.sock")


def _spawn_server(path: str, policies: list[tuple[str, str]], lock_fd: int) -> int:
    """Start the policy server in its own session, handing it ``lock_fd`` (held for its whole life)."""
    log = path[: -len(".sock")] + ".log"
    with open(log, "ab") as log_file:
        (problem, policy), *others = policies
        argv = [sys.executable, "-m", "optgym.serve.server", "--socket", path, "--problem", problem, "--policy", policy]
        argv += [arg for other, spec in others for arg in ("--with", f"{other}={spec}")]
        argv += ["--idle", os.environ.get("OPTGYM_SERVER_IDLE", "60"), "--lock-fd", str(lock_fd)]
        stdio = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, log_file.fileno(), 1),
            (os.POSIX_SPAWN_DUP2, log_file.fileno(), 2),
        ]
        # The server skips gymnasium's registration (see optgym/__init__.py): a third of its start.
        env = {**os.environ, "OPTGYM_NO_GYMNASIUM": "1"}
        os.set_inheritable(lock_fd, True)
        try:
            return os.posix_spawn(sys.executable, argv, env, setsid=True, file_actions=stdio)
        finally:
            os.set_inheritable(lock_fd, False)


def _connect(policies: list[tuple[str, str]], clang: str, path: str | None = None):  # -> _socket.socket
    """A connection to these policies' server, starting the server if none is listening.

    Exactly one server starts, however many compiles of a parallel build arrive at once: the one
    launcher that takes ``serve-….lock`` (``flock``) spawns it and hands it the lock, which it holds
    until it exits; the others wait for its socket. (Without the lock, ``-j N`` started up to N
    servers, each loading the policy and all but one never used, on the build's critical path.)
    """
    import _socket

    path = path or _server_socket(policies, clang)  # the caller's, when it has it already
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(path)
        return sock
    except (FileNotFoundError, ConnectionRefusedError):
        pass
    import fcntl
    import time

    lock_fd = os.open(path[: -len(".sock")] + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    pid = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if pid is None:
                try:
                    fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    pass  # a server is starting (or exiting): wait for its socket, or for the lock
                else:
                    pid = _spawn_server(path, policies, lock_fd)
            try:
                sock.connect(path)
                return sock
            except (FileNotFoundError, ConnectionRefusedError):
                pass
            if pid is not None and os.waitpid(pid, os.WNOHANG)[0]:  # it died while starting: say why
                with open(path[: -len(".sock")] + ".log", "rb") as f:
                    tail = f.read()[-300:].decode("utf-8", "replace").strip().splitlines()
                raise OSError(f"the policy server did not start: {tail[-1] if tail else 'no output'}")
            time.sleep(0.002)
    finally:
        os.close(lock_fd)
    raise OSError(f"the policy server did not answer within 60 s (log: {path[: -len('.sock')]}.log)")


def serve_request(
    clang: str,
    args: list[str],
    policies: list[tuple[str, str]],
    thinlto: bool = False,
    portfolio: str | None = None,
    link: bool = False,
    direct: tuple[str, tuple[str, ...]] | None = None,
    socket_path: str | None = None,
) -> dict:
    """Hand the compile to the server (argv, cwd, environment; our stdout and stderr as descriptors)
    and wait for its one reply, read to the end of the connection. ``thinlto``: the compile is a ThinLTO
    backend of a link (:mod:`optgym_cc.thinlto`), or with ``link`` the link itself, whose backends run inside
    lld one after another; ``portfolio``: the file of its target's portfolio, for which
    alone it is sent (:func:`target_portfolio`), so a compile that portfolio does not take is clang's own;
    ``direct``: the plans file and key under which the server records that a C compile is clang's own with
    pass options (:mod:`optgym_cc.direct`); ``socket_path``: the server's socket, when the caller has it."""
    import _socket
    import marshal

    message: dict[str, object] = {"argv": [clang, *args], "cwd": os.getcwd(), "env": dict(os.environ)}
    message |= ({"thinlto": True} if thinlto else {}) | ({"portfolio": portfolio} if portfolio else {})
    message |= ({"link": True} if link else {}) | ({"direct": direct} if direct else {})
    request = marshal.dumps(message)
    fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (1, 2))  # two C ints, as SCM_RIGHTS takes them
    for attempt in range(2):
        sock = _connect(policies, clang, socket_path)
        chunks = []
        try:
            sock.sendmsg([request], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
            while chunk := sock.recv(65536):
                chunks.append(chunk)
            break
        except (ConnectionResetError, BrokenPipeError):
            # A reset means the server closed the connection with our request unread: an idle server that left
            # between our connect and its accept. No compile of ours ran, so the next connection (to a new
            # server) does it. A server that dies after reading the request gives an end of file instead.
            if attempt:
                raise
        finally:
            sock.close()
    try:
        reply = marshal.loads(b"".join(chunks))
    except (EOFError, ValueError, TypeError):
        raise OSError("the policy server went away mid-compile") from None
    if not isinstance(reply, dict):
        raise OSError("the policy server sent a malformed reply")
    return reply


def direct_plan(
    args: list[str], driver: str, socket_path: str, portfolio: str | None
) -> tuple[list[str] | None, tuple[str, tuple[str, ...]] | None]:
    """``(flags, where)`` of a compile: the pass options of a C compile the server (at ``socket_path``) has said is
    clang's own with them, which the launcher runs itself (:mod:`optgym_cc.direct`), else ``None`` and — for a C
    compile — the plans file and key the server records its plan under. A build's own ``-mllvm`` options always
    go to the server, which knows which of them clash with a portfolio's."""
    if not compiles_c(args, driver) or any(arg.startswith("-mllvm") for arg in args):
        return None, None
    from optgym_cc import direct

    path = portfolio or os.environ.get("OPTGYM_PORTFOLIO") or os.path.join(PRETRAINED_DIR, PORTFOLIO)
    if (compile_key := direct.key(path, portfolio is not None)) is None:
        return None, None
    plans = direct.plans_file(_cache_root(), socket_path)
    flags = direct.plan(plans, compile_key) if direct.timeout() is not None else None
    return flags, (plans, compile_key)


def _main(driver: str, program: str) -> None:
    clang = _clang(driver)
    args = sys.argv[1:]
    if explicit_target(args) is None and (prefixed := driver_target(program)):
        args = [f"--target={prefixed}", *args]  # clang's own prefixed drivers do this; we exec clang by its path
    if "-c" not in args and lto(args):  # a link step of an LTO build: its backends may be served
        from optgym_cc import thinlto

        thinlto.link(clang, args)
    target = compile_target(args)
    policies, missing = target_policies(target)
    if (not policies and not missing) or not may_serve(args):
        os.execv(clang, [clang, *args])
    policies, missing, portfolio = compile_plan(target, args, driver, policies, missing)
    if missing:
        note_once(target[1], target[0], missing, args)
        if not policies:
            os.execv(clang, [clang, *args])
    policy = " + ".join(spec if problem == CHANNELS[0][0] else f"{problem}={spec}" for problem, spec in policies)
    strict = os.environ.get("OPTGYM_STRICT") == "1"
    try:
        socket_path = _server_socket(policies, clang)
        flags, where = direct_plan(args, driver, socket_path, portfolio)
        if flags is not None:
            from optgym_cc import direct

            reply = direct.run(clang, args, flags, _runtime_root())
        else:
            reply = serve_request(clang, args, policies, portfolio=portfolio, direct=where, socket_path=socket_path)
    except (OSError, ValueError) as e:
        reply = {"fallback": True, "warning": str(e)}
    if reply.get("warning"):
        if strict:
            sys.stderr.write(f"optgym-cc: error: {reply['warning']} (OPTGYM_STRICT=1)\n")
            sys.stderr.flush()
            os._exit(1)
        what = "compiled without optgym" if reply.get("fallback") else "continuing"
        sys.stderr.write(f"optgym-cc: warning: policy {policy}: {reply['warning']}; {what}\n")
        sys.stderr.flush()
    if reply.get("fallback"):
        os.execv(clang, [clang, *args])
    returncode = int(reply["returncode"])
    # os._exit: nothing is left to clean up, and the interpreter's orderly shutdown costs ~1.7 ms of
    # CPU (perf stat), once per compile of the build.
    os._exit(returncode if returncode >= 0 else 128 - returncode)


#: The name the build ran the front door by (``scripts/optgym-cc``: ``optgym-cc``, ``optgym-c++``, or a
#: triple-prefixed link to either), which it hands to the launcher: the launcher's own name is not the build's.
FRONT_NAME_VARIABLE = "OPTGYM_FRONT_NAME"


def main() -> None:
    """``optgym-cc-launcher``: the steps ``optgym-cc``/``optgym-c++`` (``scripts/optgym-cc``, a ``/bin/sh``
    front door) do not pass to clang themselves. The driver comes from the name the build used: a ``++``
    name compiles and links as ``clang++``. The variable is taken out of the environment, so neither clang
    nor the policy server inherits it."""
    program = os.environ.pop(FRONT_NAME_VARIABLE, sys.argv[0])
    _main("clang++" if program.endswith("++") else "clang", program)
