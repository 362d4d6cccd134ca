"""ThinLTO links through ``optgym-cc``: the policies decide the inlining and register allocation of every backend.

Under ThinLTO the inlining that shapes the shipped program happens at the link, in one backend compile per
module (after cross-module import), not in the ``-flto=thin`` compile steps, which only write bitcode. A served
link's backends run one of two ways (``OPTGYM_LTO_BACKENDS``, :data:`BACKENDS`):

* ``lld`` (the default): inside the link, as lld runs them, side by side (the link's ``--thinlto-jobs``).
  clang-22 names each decision's channel with one option per process, so the policy server preloads a small
  library into lld that gives each of its threads its own channel names, a *lane*
  (:mod:`optgym.toolchain.lanes`). A thread runs one backend at a time, so a lane's backends come one after
  another: each opens the channel, sends its header, is decided, and closes it — a *session*. The server runs the
  link itself and answers every session of every lane (:class:`optgym.toolchain.interactive.InteractiveCompile`
  with ``sessions`` and ``lanes``). Without the library the backends run one at a time on one set of channels. A
  link it cannot serve runs again with clang's own backends, and a served link that fails is clang's own link,
  each with one warning line. No clang starts per backend.
* ``distributed``: lld-22 hands the backends to an outside *distributor* (DTLTO): given
  ``--thinlto-distributor=PROG``, it writes a JSON file — ``common.args``, the backend compiler's command
  (``clang -c --target=… -O2 …``), and ``jobs[]``, each with its own ``args`` (``X.o -fthinlto-index=… -o
  X.native.o``) — runs ``PROG [distributor args] FILE.json``, and links the native objects it gets back (the same
  program as lld's own backends, checked on clang-22/lld-22). optgym is that distributor (``python -m
  optgym_cc.thinlto FILE``, below): each backend is one request to the policy server, like a served compile, with
  its own clang and channels, as many at once as the link's ``--thinlto-jobs`` (else every core). Each costs a
  clang start (~35 ms). A backend whose serving fails runs as clang's own, with one warning line for the link;
  ``optgym corpus thinlto`` records backends this way.

``OPTGYM_STRICT=1`` fails a link that cannot be served instead. The launcher's part (:func:`link_plan`): a link
step (no ``-c``) with ``-flto=thin`` that links with lld is planned; with ``-flto``/``-flto=full`` (clang-22's
full-LTO pipeline builds its inliner without the ML advisor, so nothing could be served) or without lld (only
lld distributes backends, and only its in-process backends were checked) it is clang's own link, with one note
saying why. A backend serves up to three decisions, each with its own policy and channel
(:data:`LTO_CHANNELS`): inlining (``OPTGYM_LTO_POLICY``), and the register allocator's eviction and priority
(``OPTGYM_LTO_EVICT_POLICY``, ``OPTGYM_LTO_PRIORITY_POLICY``). ``pretrained`` is the ThinLTO policy shipped in the
package for the link's target (``inline-size-thinlto.onnx``, ``regalloc-evict-thinlto.onnx``…), else ``heuristic``,
clang's own decision, whose channel is then not opened at all. Inlining defaults to ``pretrained``, the allocator's
two to ``heuristic``: their cost is the build's to accept (:data:`LTO_CHANNELS`). The non-LTO policies are not
used here: they were chosen on per-object sizes, and a backend sees the whole program's imports.

Beside the policy, a ThinLTO link takes its target's *plan* (``thinlto.json``, :func:`lto_plan`): lld options
(``link_flags``, e.g. ``--icf=safe``) and LLVM options for the thin link and every backend (``llvm_options``, e.g.
how much ThinLTO imports across modules) — knobs of passes the link runs anyway, chosen by measuring linked
training packages (``python -m maintainer.thinlto_plan``). They go before the build's own flags, so a build that
says otherwise wins. lld does not forward its ``-mllvm`` options to distributed backends, so the distributor adds
them to each backend command itself. ``OPTGYM_LTO_PLAN=FILE`` takes another plan, ``none`` none.

Standard library only, like the launcher: the distributor runs once per link.
"""

from __future__ import annotations

import os
import sys

import optgym_cc as cc

#: The decisions a ThinLTO backend can serve: (problem, the environment variable naming its policy, the file
#: shipped for it beside a target's other policies, the policy when the variable is unset). The order is the
#: launcher's (:data:`optgym_cc.CHANNELS`). The eviction scorer serves by default since backends run side by side
#: in lanes: on seven training packages it took linked .text from the plan's 0.9629 of plain ThinLTO to 0.9606,
#: at 1.03-1.13x plain ThinLTO's build wall on 2 cores. The priority scorer is asked for: its many decisions cost
#: 1.15-1.30x there (libwebp, whose many programs relink the library's backends, the most), for more .text
#: (docs/experiments/2026-11-29-lanes.md).
LTO_CHANNELS = (
    ("inline-size", "OPTGYM_LTO_POLICY", "inline-size-thinlto.onnx", "pretrained"),
    ("regalloc-evict", "OPTGYM_LTO_EVICT_POLICY", "regalloc-evict-thinlto.onnx", "pretrained"),
    ("regalloc-priority", "OPTGYM_LTO_PRIORITY_POLICY", "regalloc-priority-thinlto.onnx", "heuristic"),
)


def served_by_default() -> list[tuple[str, str]]:
    """The ThinLTO policies a link serves with no variable set, as (problem, file name); a target serves each only
    where that file ships in its directory."""
    return [(problem, shipped) for problem, _, shipped, default in LTO_CHANNELS if default == "pretrained"]


#: The backends run clang's -O2 pipeline over the -Oz compile's ``minsize`` functions; at -O2 the ML advisor
#: stops inlining once a module's size doubles unless told otherwise, and clang's own backends never stop.
BACKEND_FLAGS = ("-mllvm", "-ml-advisor-size-increase-threshold=1000")
#: Where a served link's backends run (``OPTGYM_LTO_BACKENDS``): ``lld``, inside the link, side by side in lanes,
#: each backend a session of one channel per decision; or ``distributed``, each its own clang and channels, side
#: by side, through lld's distributor. A distributed backend costs a clang start (~35 ms).
BACKENDS = "OPTGYM_LTO_BACKENDS"
BACKENDS_MODES = ("lld", "distributed")
#: Serve only links whose object and archive inputs come to at least this many bytes (``OPTGYM_LTO_SERVE_FROM``,
#: default :data:`DEFAULT_SERVE_FROM`; 0 serves every link); a lighter link takes the plan alone. A served link pays
#: a fixed price that a small link's own work does not cover: the server's start once a build (~0.12 s) and ~25 ms
#: a link. On builds of about a second that was 1.21-1.23x plain ThinLTO (lto11), and links that small hold few
#: of a program's bytes (docs/experiments/2026-11-29-lto11.md).
SERVE_FROM = "OPTGYM_LTO_SERVE_FROM"
DEFAULT_SERVE_FROM = 256 * 1024


#: The file of a target's ThinLTO plan (:func:`lto_plan`), beside its policies.
PLAN = "thinlto.json"
PLAN_FORMAT = "optgym-thinlto/1"
#: Triples whose linker is not ELF lld (ld64.lld, lld-link, wasm-ld): the shipped plans' options are ELF lld's.
NOT_ELF = ("apple", "darwin", "macos", "ios", "windows", "mingw", "msvc", "cygwin", "wasm")


#: ``OPTGYM_THINLTO_CAPTURE=DIR``: every backend of every ThinLTO link is recorded in ``DIR`` for a corpus
#: (:func:`capture`), whatever the policy; ``optgym corpus thinlto --build`` sets it.
CAPTURE = "OPTGYM_THINLTO_CAPTURE"


def lto_policy(args: list[str] | None = None, channel: tuple[str, str, str, str] = LTO_CHANNELS[0]) -> str:
    """The policy of one of :data:`LTO_CHANNELS` (default inlining) as a spec the server loads: its variable (else
    the channel's default), and ``pretrained`` becomes the path of the file shipped for the link's target
    (:func:`optgym_cc.shipped_policy`; ``args``: the link's command line, else this machine's target), or
    ``heuristic`` where that target has none — a link for another target never gets x86-64's."""
    _, variable, shipped, default = channel
    spec = os.environ.get(variable) or default
    if spec != "pretrained":
        return spec
    return cc.shipped_policy(shipped, cc.compile_target(args or [])) or "heuristic"


def lto_policies(args: list[str] | None = None) -> list[tuple[str, str]]:
    """``(problem, spec)`` of every decision a link's backends serve: those whose policy is not ``heuristic``.
    Empty: the backends are clang's own."""
    served = [(channel[0], lto_policy(args, channel)) for channel in LTO_CHANNELS]
    return [(problem, spec) for problem, spec in served if spec != "heuristic"]


def describe(policies: list[tuple[str, str]]) -> str:
    """How a link's policies read in its notes and warnings: ``never`` alone, else ``problem=spec, …``."""
    if len(policies) == 1 and policies[0][0] == LTO_CHANNELS[0][0]:
        return policies[0][1]
    return ", ".join(f"{problem}={spec}" for problem, spec in policies) or "heuristic"


def plan_path(args: list[str]) -> str | None:
    """The file of a link's ThinLTO plan: ``OPTGYM_LTO_PLAN`` (a file, or ``none``), else the one shipped for the
    link's target, else ``None``."""
    spec = os.environ.get("OPTGYM_LTO_PLAN") or "pretrained"
    target = cc.compile_target(args)
    if spec == "none" or (spec == "pretrained" and any(word in target[0] for word in NOT_ELF)):
        return None
    return cc.shipped_policy(PLAN, target) if spec == "pretrained" else spec


def read_plan(path: str) -> dict:
    """A plan file, checked. Raises ``ValueError`` for a file that is not a plan, ``OSError`` for one that cannot
    be read: the launcher turns either into one note and clang's own link."""
    import json

    with open(path, encoding="utf-8") as f:
        try:
            plan = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not JSON ({e})") from None
    if not isinstance(plan, dict) or plan.get("format") != PLAN_FORMAT:
        raise ValueError(f"{path} is not a ThinLTO plan (format {PLAN_FORMAT})")
    for key in ("link_flags", "llvm_options"):
        if not all(isinstance(flag, str) and flag.startswith("-") and "\n" not in flag for flag in plan.get(key, [])):
            raise ValueError(f"{path}: {key} must be a list of options")
    return plan


def lto_plan(args: list[str]) -> dict:
    """The ThinLTO plan of a link (:func:`plan_path`, :func:`read_plan`), else none (``{}``)."""
    path = plan_path(args)
    return read_plan(path) if path else {}


#: The first line of a plan's options kept in optgym's cache (:func:`plan_options`).
OPTIONS_CACHE_FORMAT = "optgym-thinlto-options/1"


def plan_options(args: list[str]) -> tuple[list[str], list[str]] | None:
    """``(link_flags, llvm_options)`` of a link's plan, or ``None`` without one; raises as :func:`read_plan`.

    The link step needs only these two lists, and importing ``json`` to read them cost every ThinLTO link about
    8 ms of the launcher's price (docs/serving.md#how-it-runs). So they are read from the plan once per version of
    the file (its path, inode, size and mtime) and kept as lines in ``$OPTGYM_CACHE_DIR/thinlto-plans/``, as
    optgym keeps what it learns of a clang binary; a plan that is edited is read again. A cache that cannot be
    written costs the time, never the link."""
    path = plan_path(args)
    if path is None:
        return None
    stat = os.stat(path)
    ident = f"{os.path.abspath(path)}\0{stat.st_ino}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()
    cached = os.path.join(cc._cache_root(), "thinlto-plans", cc._sha256_hex(ident)[:24])
    try:
        with open(cached, encoding="utf-8") as f:
            lines = f.read().split("\n")
        if lines[0] == OPTIONS_CACHE_FORMAT:
            return ([line[2:] for line in lines[1:] if line[:2] == "L "],
                    [line[2:] for line in lines[1:] if line[:2] == "O "])  # fmt: skip
    except OSError:
        pass
    plan = read_plan(path)
    flags, options = list(plan.get("link_flags", [])), list(plan.get("llvm_options", []))
    text = "\n".join([OPTIONS_CACHE_FORMAT, *(f"L {flag}" for flag in flags), *(f"O {o}" for o in options)])
    try:
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        partial = f"{cached}.{os.getpid()}"
        with open(partial, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(partial, cached)
    except OSError:
        pass
    return flags, options


def _uses_lld(args: list[str]) -> bool:
    linker = None
    for arg in args:
        if arg.startswith("-fuse-ld="):
            linker = arg.split("=", 1)[1]
        elif arg.startswith("--ld-path="):
            linker = os.path.basename(arg.split("=", 1)[1])
    return linker is not None and (linker == "lld" or "lld" in os.path.basename(linker))


def _relocatable(args: list[str]) -> bool:
    """Whether the link makes a relocatable object (``-r``), which lld cannot garbage-collect or fold."""
    items = [item for arg in args for item in (arg.split(",")[1:] if arg.startswith("-Wl,") else [arg])]
    return any(item in ("-r", "--relocatable", "-relocatable") for item in items)


def link_jobs(args: list[str]) -> int:
    """How many backends the link asked to run at once (``-flto-jobs=N``, ``-Wl,--thinlto-jobs=N``), else every
    core. ``all`` and thread-count strategies other than a plain number count as every core."""
    jobs = None
    for arg in args:
        for item in arg.split(",")[1:] if arg.startswith("-Wl,") else [arg]:
            for prefix in ("-flto-jobs=", "--thinlto-jobs=", "-thinlto-jobs="):
                if item.startswith(prefix) and item[len(prefix) :].isdigit():
                    jobs = int(item[len(prefix) :]) or None
    return jobs or os.cpu_count() or 1


def is_link(args: list[str]) -> bool:
    """Whether this driver call links: no ``-c``/``-E``/``-S``/… and at least one input."""
    if "-c" in args or any(a in cc.NOT_SERVED for a in args):
        return False
    inputs, _ = cc.operands(args)
    return bool(inputs)


def backends_mode() -> str:
    """``OPTGYM_LTO_BACKENDS`` (default ``lld``); anything else is an error the build is told about."""
    mode = os.environ.get(BACKENDS, "").strip() or BACKENDS_MODES[0]
    if mode not in BACKENDS_MODES:
        raise ValueError(f"{BACKENDS}={mode!r} is not one of {', '.join(BACKENDS_MODES)}")
    return mode


def serve_from() -> int:
    """``OPTGYM_LTO_SERVE_FROM`` in bytes (default :data:`DEFAULT_SERVE_FROM`); anything else is an error the build
    is told about."""
    value = os.environ.get(SERVE_FROM, "").strip() or str(DEFAULT_SERVE_FROM)
    if not value.isdigit():
        raise ValueError(f"{SERVE_FROM}={value!r} is not a number of bytes")
    return int(value)


def input_bytes(args: list[str]) -> int:
    """What a link's object and archive inputs weigh on disk (shared libraries left out: no backend comes from
    them); an input that cannot be read counts nothing."""
    total = 0
    for path in cc.operands(args)[0]:
        if ".so" not in os.path.basename(path) and os.path.isfile(path):
            total += os.path.getsize(path)
    return total


def without_link_jobs(args: list[str]) -> list[str]:
    """``args`` with the link's own backend parallelism taken out (``-flto-jobs=N``, and ``--thinlto-jobs=N`` in
    ``-Wl,`` lists): the server sets the link's lanes itself."""
    kept = []
    for arg in args:
        if arg.startswith("-flto-jobs="):
            continue
        if arg.startswith("-Wl,"):
            items = [i for i in arg.split(",")[1:] if not i.startswith(("--thinlto-jobs=", "-thinlto-jobs="))]
            if not items:
                continue
            arg = ",".join(["-Wl", *items])
        kept.append(arg)
    return kept


def _link_settings(args: list[str]) -> tuple[tuple[list[str], list[str]] | None, str, int]:
    """A link's plan options (:func:`plan_options`), ``OPTGYM_LTO_BACKENDS`` and ``OPTGYM_LTO_SERVE_FROM``; one that
    cannot be used is a ``ValueError`` whose message says which."""
    try:
        plan = plan_options(args)  # a corpus records the links the build makes: the plan's too
    except (OSError, ValueError) as e:
        raise ValueError(f"ThinLTO plan: {e}") from e
    return plan, backends_mode(), serve_from()


def link_plan(args: list[str], clang: str) -> tuple[list[str], str | None, bool]:
    """What a link step becomes: its command line after the driver (the plan's options before the build's own,
    the backends' flags after them: ``args`` unchanged is clang's own link), a note for the build, or ``None``,
    and whether the policy server runs the link (its backends served inside lld, :data:`BACKENDS`). A plan or
    setting that cannot be used is a note and clang's own link, or with ``OPTGYM_STRICT=1`` the error."""
    mode = cc.lto(args)
    capturing = bool(os.environ.get(CAPTURE))
    policies = lto_policies(args)
    if mode is None or not is_link(args):
        return args, None, False
    try:
        plan, where, smallest = _link_settings(args)
    except ValueError as e:
        if os.environ.get("OPTGYM_STRICT") == "1":
            raise
        return args, f"{e}; linked as clang does", False
    if not policies and plan is None and not capturing:
        return args, None, False
    if mode != "-flto=thin":
        why = f"{mode} links with full LTO, whose inliner in clang-22 takes no ML advice; linked as clang does"
        return args, why, False
    if not _uses_lld(args):
        return args, "only lld hands ThinLTO backends to optgym (add -fuse-ld=lld); linked as clang does", False
    if _relocatable(args):
        return args, "a relocatable link (-r) makes no program yet; linked as clang does", False
    link_flags, options = plan or ([], [])
    ahead = [*(f"-Wl,{flag}" for flag in link_flags), *(f"-Wl,-mllvm={o}" for o in options)]
    if not capturing and (not policies or (smallest and input_bytes(args) < smallest)):
        return [*ahead, *args], None, False  # clang's own backends, in lld: they get the options from it
    if where == "lld" and not capturing:  # the server runs the link (:func:`served_link`)
        return [*ahead, *args], None, True
    distributor = [sys.executable, "-m", "optgym_cc.thinlto", "--jobs", str(link_jobs(args)),
                   *(f"--policy={problem}={spec}" for problem, spec in policies),
                   *(f"--llvm-option={option}" for option in options)]  # fmt: skip
    return (
        [
            *ahead,
            *args,
            f"-Wl,--thinlto-distributor={distributor[0]}",
            *(f"-Wl,--thinlto-distributor-arg={arg}" for arg in distributor[1:]),
            f"-Wl,--thinlto-remote-compiler={clang}",
        ],
        None,
        False,
    )


def link(clang: str, args: list[str]) -> None:
    """Run a link step of an LTO build (never returns): as :func:`link_plan` makes it, and if that link fails,
    clang's own link of the same command with one warning line — a plan's option that some link cannot take
    never breaks the build (``OPTGYM_STRICT=1``: the failure stands). A link optgym leaves alone is exec'd. A
    link the server runs (its backends served inside lld) that cannot be served is linked again with the plan
    alone, and one that fails there is clang's own link, each with one warning line (:func:`served_link`)."""
    strict = os.environ.get("OPTGYM_STRICT") == "1"
    try:
        planned, note, in_lld = link_plan(args, clang)
    except ValueError as e:  # only with OPTGYM_STRICT=1: otherwise a note
        sys.stderr.write(f"optgym-cc: error: {e} (OPTGYM_STRICT=1)\n")
        sys.exit(1)
    if note:
        sys.stderr.write(f"optgym-cc: note: {note}\n")
        sys.stderr.flush()
    if in_lld:
        served_link(clang, args, planned, strict)  # returns only when the link must run unserved
    if planned == args:
        os.execv(clang, [clang, *args])
    returncode, stdout, stderr = _run_keeping_output([clang, *planned])
    if returncode == 0 or strict:
        sys.stdout.buffer.write(stdout)
        sys.stderr.buffer.write(stderr)
        sys.exit(returncode if returncode >= 0 else 128 - returncode)
    why = first_error(stderr.decode(errors="replace"))
    sys.stderr.write(f"optgym-cc: warning: the ThinLTO link failed with optgym's plan and policy ({why}); "
                     "linked as clang does\n")  # fmt: skip
    sys.stderr.flush()
    os.execv(clang, [clang, *args])


def first_error(text: str) -> str:
    """The first line of a failed link's diagnostics that says ``error``, for a one-line warning."""
    return next((line.strip() for line in text.splitlines() if "error" in line), "")


def served_link(clang: str, args: list[str], planned: list[str], strict: bool) -> None:
    """Hand the link ``planned`` to the policy server, which runs it with its backends inside lld, side by side in
    lanes (each lld thread on its own channels), every decision served; exit with its status.
    Return only when the link must run unserved: no policy decides its language, or the server or a policy
    failed (one warning line; ``OPTGYM_STRICT=1``: the failure stands instead). A served link that fails is
    clang's own link of ``args`` instead, with one warning line: its errors, if the build's, are clang's to say."""
    policies = lto_policies(planned)
    policy = describe(policies)
    try:
        reply = cc.serve_request(clang, planned, policies, thinlto=True, link=True)
    except (OSError, ValueError) as e:
        reply = {"fallback": True, "warning": str(e)}
    if not reply.get("fallback") and not reply.get("warning"):
        if os.environ.get("OPTGYM_VERBOSE") == "1":
            sys.stderr.write(f"optgym-cc: ThinLTO: {reply.get('sessions', 0)} backend sessions in lld "
                             f"({reply.get('lanes', 1)} side by side) served by {policy}, "
                             f"{int(reply.get('decisions', 0))} decisions\n")  # fmt: skip
        sys.exit(int(reply["returncode"]))
    if not reply.get("warning"):  # no policy decides this link's language: clang's own backends
        return
    if strict or not reply.get("fallback"):
        sys.stderr.write(f"optgym-cc: {'error' if strict else 'warning'}: ThinLTO policy {policy}: {reply['warning']}"
                         f"{' (OPTGYM_STRICT=1)' if strict else ''}\n")  # fmt: skip
        sys.exit(1 if reply.get("fallback") else int(reply["returncode"]))
    if reply.get("link_failed"):
        sys.stderr.write(f"optgym-cc: warning: ThinLTO policy {policy}: {reply['warning']}; linked as clang does\n")
        sys.stderr.flush()
        os.execv(clang, [clang, *args])
    sys.stderr.write(f"optgym-cc: warning: ThinLTO policy {policy}: the link was not served: {reply['warning']}; "
                     "linked with clang's own backends\n")  # fmt: skip
    sys.stderr.flush()


def _run_keeping_output(argv: list[str]) -> tuple[int, bytes, bytes]:
    """Run ``argv`` (an absolute path first) and return its exit code (``-N`` for signal N, as ``subprocess``
    gives it), stdout and stderr. Its output goes to unnamed files, not pipes: a pipe would also wait for any
    process that inherited it. ``os.posix_spawn`` and ``O_TMPFILE`` instead of ``subprocess`` and ``tempfile``:
    those two imports cost every ThinLTO link about 12 ms (docs/serving.md#how-it-runs)."""
    files = [_unnamed_file(), _unnamed_file()]
    try:
        actions = [(os.POSIX_SPAWN_DUP2, fd, stream) for fd, stream in zip(files, (1, 2), strict=True)]
        pid = os.posix_spawn(argv[0], argv, os.environ, file_actions=actions)
        returncode = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        stdout, stderr = (_read_all(fd) for fd in files)
    finally:
        for fd in files:
            os.close(fd)
    return returncode, stdout, stderr


def _unnamed_file() -> int:
    """A file descriptor of a file with no name in the temporary directory (gone when closed)."""
    directory = os.environ.get("TMPDIR") or "/tmp"
    try:
        return os.open(directory, os.O_TMPFILE | os.O_RDWR, 0o600)
    except (AttributeError, OSError):  # no O_TMPFILE on this platform or file system: a named file, unlinked
        import tempfile

        fd, path = tempfile.mkstemp(dir=directory)
        os.unlink(path)
        return fd


def _read_all(fd: int) -> bytes:
    """Everything written to ``fd``, from its start."""
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def _place(path: str, workdir: str) -> None:
    """Hard-link (or copy) ``path``, relative to the link's directory, to the same relative path in ``workdir``."""
    import shutil

    target = os.path.normpath(os.path.join(workdir, path))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    try:
        os.link(path, target)
    except OSError:
        shutil.copyfile(path, target)


def keep_outputs(spec: dict, workdir: str) -> None:
    """Keep each backend's native object beside its captured inputs: what the link got, for checking replays."""
    for job in spec["jobs"]:
        for path in job["outputs"]:
            if os.path.exists(path) and not os.path.isabs(path):
                _place(path, workdir)


def capture(spec: dict, root: str, llvm_options: tuple[str, ...] = ()) -> str:
    """Record the backends of lld's plan ``spec`` under ``root`` for a corpus before they run (lld deletes the
    index files and the archive members it extracted once the link is done); the working directory made for them.

    A backend reads its module, its index and the modules it imports under the paths the link named them by,
    relative to the link's directory (CMake's ``CMakeFiles/x.dir/a.c.o``, lld's ``lib.a(m.o at 156).2.54B4.o``):
    its module identifier is that path, and a compile given another path for it compiles to nothing. Its command
    carries the plan's ``llvm_options``, which the link gave every backend. So every
    input is placed in a fresh working directory of this link at the same relative path, and ``backends.jsonl``
    gets one line per job: that directory and the job's command (lld's common arguments and the job's own, the
    module first), to be run there. Absolute inputs stay where they are (a toolchain's, the build tree's); ``..``
    in a path is met by nesting the directory."""
    import json
    import tempfile

    jobs = spec["jobs"]
    inputs = sorted({path for job in jobs for path in job["inputs"] if not os.path.isabs(path)})
    depth = max((len(p) - len(p.lstrip("./")) for p in inputs), default=0)  # a safe bound on leading ".."s
    os.makedirs(os.path.join(root, "links"), exist_ok=True)
    link_dir = tempfile.mkdtemp(prefix=os.path.basename(spec["common"].get("linker_output", "link")) + ".",
                                dir=os.path.join(root, "links"))  # fmt: skip
    workdir = os.path.join(link_dir, *(["w"] * depth))
    for path in inputs:
        _place(path, workdir)
    where = {"workdir": os.path.relpath(workdir, root), "link": spec["common"].get("linker_output"), "cwd": os.getcwd()}
    common = [*spec["common"]["args"], *(arg for option in llvm_options for arg in ("-mllvm", option))]
    records = [json.dumps(where | {"common": common, "job": job["args"]}) for job in jobs]
    with open(os.path.join(root, "backends.jsonl"), "a", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in records))  # one write: parallel links do not interleave lines
    return workdir


class Backend:
    """What became of one backend: clang's exit status, a warning when its serving failed, whether a policy
    decided it (a backend of a language no policy decides is clang's own, and no failure), and its decisions.
    A plain class: ``typing.NamedTuple`` would cost the launcher ~20 ms of imports."""

    __slots__ = ("decisions", "served", "status", "warning")

    def __init__(self, status: int, warning: str | None = None, served: bool = False, decisions: int = 0) -> None:
        self.status, self.warning, self.served, self.decisions = status, warning, served, decisions


def _backend(argv: list[str], policies: list[tuple[str, str]]) -> Backend:
    """One backend: served by the policy server, else clang's own."""
    import subprocess

    if not policies:  # clang's own decisions (a corpus capture): no server
        return Backend(subprocess.run(argv).returncode)
    try:
        reply = cc.serve_request(argv[0], argv[1:], policies, thinlto=True)
    except (OSError, ValueError) as e:
        reply = {"fallback": True, "warning": str(e)}
    if not reply.get("fallback") and not reply.get("warning"):
        return Backend(int(reply["returncode"]), None, True, int(reply.get("decisions", 0)))
    if reply.get("fallback") and not reply.get("warning"):  # no policy decides this backend's language: clang's
        return Backend(subprocess.run(argv).returncode)
    if os.environ.get("OPTGYM_STRICT") == "1" or not reply.get("fallback"):
        return Backend(1 if reply.get("fallback") else int(reply["returncode"]), reply.get("warning"))
    return Backend(subprocess.run(argv).returncode, reply.get("warning") or "the backend fell back")


def remove_partial_outputs(spec: dict) -> None:
    """Remove what a backend killed mid-write left: clang writes ``X.o`` as ``X-<8 hex>.o.tmp`` and renames it
    when done, so a clang that died with its server (SIGKILL, no clean-up) leaves that file in the link's
    directory. Only files of that pattern next to a job's own outputs are touched."""
    import glob

    for job in spec["jobs"]:
        for path in job["outputs"]:
            stem, ext = os.path.splitext(path)
            for partial in glob.glob(f"{glob.escape(stem)}-{'[0-9a-f]' * 8}{glob.escape(ext)}.tmp"):
                os.remove(partial)


def distribute(plan: str, jobs: int, policies: list[tuple[str, str]], llvm_options: tuple[str, ...] = ()) -> int:
    """Run every backend of lld's ``plan`` (its JSON file), ``jobs`` at a time, each served by ``policies``
    (``(problem, spec)``; none: clang's own) and with ``llvm_options`` (the ThinLTO plan's, which lld keeps to
    itself); the link's exit status."""
    import json
    from concurrent.futures import ThreadPoolExecutor

    with open(plan, encoding="utf-8") as f:
        spec = json.load(f)
    captured = capture(spec, root, llvm_options) if (root := os.environ.get(CAPTURE)) else None
    common = spec["common"]["args"]
    options = [arg for option in llvm_options for arg in ("-mllvm", option)]
    commands = [[*common, *BACKEND_FLAGS, *options, *job["args"]] for job in spec["jobs"]]
    policy = describe(policies)
    with ThreadPoolExecutor(max(1, min(jobs, len(commands) or 1))) as pool:
        results = list(pool.map(lambda argv: _backend(argv, policies), commands))
    if captured is not None:  # what the link got from each backend, beside its module: what a corpus replays
        keep_outputs(spec, captured)
    failed = [r.warning for r in results if r.warning]
    if failed:
        remove_partial_outputs(spec)
    strict = os.environ.get("OPTGYM_STRICT") == "1"
    if failed:
        kind = "error" if strict else "warning"
        what = "(OPTGYM_STRICT=1)" if strict else "linked with clang's own backends for those"
        sys.stderr.write(f"optgym-cc: {kind}: ThinLTO policy {policy}: {len(failed)} of {len(commands)} backends "
                         f"were not served: {failed[0]}; {what}\n")  # fmt: skip
    if os.environ.get("OPTGYM_VERBOSE") == "1":
        served = sum(r.served for r in results)
        sys.stderr.write(f"optgym-cc: ThinLTO: {served} of {len(commands)} backends served by {policy}, "
                         f"{sum(r.decisions for r in results)} decisions\n")  # fmt: skip
    return next((r.status for r in results if r.status != 0), 0)


def main(argv: list[str] | None = None) -> None:
    """``python -m optgym_cc.thinlto --jobs N [--policy=PROBLEM=SPEC…] [--llvm-option=OPT…] PLAN.json``: lld's
    distributor."""
    args = sys.argv[1:] if argv is None else argv
    try:
        jobs = int(args[args.index("--jobs") + 1])
        plan = args[-1]
    except (ValueError, IndexError):
        sys.stderr.write(f"optgym-cc: the ThinLTO distributor was called with {args}\n")
        sys.exit(2)
    policies = [tuple(arg.split("=", 2)[1:]) for arg in args if arg.startswith("--policy=")]
    options = tuple(arg.split("=", 1)[1] for arg in args if arg.startswith("--llvm-option="))
    sys.exit(distribute(plan, jobs, policies, options))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
