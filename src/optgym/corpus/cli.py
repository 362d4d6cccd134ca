"""``optgym corpus …``: making and inspecting corpora.

Every command that fans out takes ``--workers/-j`` (``--parallel``); outputs go where ``-o`` says.
Corpora are written to a staging directory and renamed into place, so an interrupted command leaves
the previous corpus (or none), never half of one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

corpus_app = typer.Typer(no_args_is_help=True, help="Make corpora from real code, and inspect them.")
console = Console(emoji=False)
err = Console(stderr=True, emoji=False)

Workers = Annotated[
    int | None, typer.Option("--workers", "-j", "--parallel", help="worker processes (default: all cores)")
]
Output = Annotated[Path, typer.Option("-o", "--output", help="the corpus directory to write")]
Include = Annotated[
    list[str] | None, typer.Option("--include", help="keep only modules matching this glob (repeatable)")
]
Exclude = Annotated[list[str] | None, typer.Option("--exclude", help="drop modules matching this glob (repeatable)")]
MaxDecisions = Annotated[
    int | None,
    typer.Option(
        "--max-decisions",
        help="drop modules with more inlining decisions than this under clang's heuristic (counted once, cached)",
    ),
]
KeepVariants = Annotated[
    bool,
    typer.Option("--keep-variants", help="keep PIC and non-PIC compiles of one source as two modules"),
]
TargetTriple = Annotated[
    str | None,
    typer.Option("--target", help="compile for this target (aarch64-linux-gnu, thumbv7em-none-eabi…); docs/targets.md"),
]
TargetFlags = Annotated[
    list[str] | None,
    typer.Option(
        "--target-flag",
        help="a flag every compile for --target gets (repeatable; split like a shell line: "
        "--target-flag=-mcpu=cortex-m4 --target-flag='-isystem DIR')",
    ),
]


def _target(triple: str | None, flags: list[str] | None):  # -> Target | None
    """The :class:`~optgym.corpus.target.Target` of ``--target``/``--target-flag``, or the error they make."""
    from optgym.corpus.target import Target

    try:
        return Target.of(triple, flags or ())
    except ValueError as e:
        _fail(str(e))


def _fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def _print_extract(report, dest: Path, verbose: bool = False) -> None:
    """One line of result, and why entries were left out (counted by reason)."""
    console.print(
        f"[bold green]corpus[/] {dest}: {len(report.modules)} modules from {report.entries} "
        f"compile entries in {report.seconds:.1f} s",
        highlight=False,
    )
    counts = report.skip_counts()
    if counts:
        console.print(f"[yellow]left out[/] {len(report.skipped)} entries:", highlight=False)
        for reason, n in counts.items():
            console.print(f"  {n:6d}  {reason}", highlight=False)
        if verbose:
            for what, reason in report.skipped:
                console.print(f"    {what}: {reason}", highlight=False)
        console.print(f"  (every entry with its reason: {dest / 'logs' / 'extract.log'})", highlight=False)
    if warning := report.opt_warning():
        console.print(f"[bold yellow]warning[/] {warning}", highlight=False, soft_wrap=True)


@corpus_app.command("extract")
def extract_cmd(
    compdb: Annotated[Path, typer.Option("--compdb", help="compile_commands.json of a -fembed-bitcode=all build")],
    output: Output,
    workers: Workers = None,
    include: Include = None,
    exclude: Exclude = None,
    keep_variants: KeepVariants = False,
    max_decisions: MaxDecisions = None,
    opt: Annotated[
        str | None, typer.Option("--opt", help="the -O level the build used: warn about modules recorded at another")
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="list every entry left out")] = False,
) -> None:
    """Objects built with ``-Xclang -fembed-bitcode=all`` → a corpus, through mlgo-utils' extract_ir.

    Only single-TU compiles (``-c``) become modules; links and other steps are left out and counted.
    """
    from optgym.corpus.extract import extract
    from optgym.errors import OptgymError
    from optgym.toolchain import find_toolchain

    try:
        report = extract(
            find_toolchain(),
            compdb,
            output,
            workers=workers,
            include=include or (),
            exclude=exclude or (),
            keep_variants=keep_variants,
            max_decisions=max_decisions,
            opt=opt,
        )
    except OptgymError as e:
        _fail(str(e))
    _print_extract(report, output, verbose)


def _print_left_out(dest: Path) -> None:
    """What ``--max-decisions`` left out of a merged corpus (recorded in its description), counted by reason."""
    from collections import Counter

    from optgym.corpus.staging import read_description

    record = read_description(dest).get("optgym", {}).get("max_decisions")
    if record and record["left_out"]:
        counts = Counter(record["left_out"].values())
        console.print(f"[yellow]left out[/] {len(record['left_out'])} modules:", highlight=False)
        for reason, n in counts.most_common():
            console.print(f"  {n:6d}  {reason}", highlight=False)


Opt = Annotated[str, typer.Option("--opt", help="optimization level of the build (-Oz, -Os, -O2…)")]


def _print_build(result, dest: Path, verbose: bool = False) -> None:
    console.print(
        f"[bold]built[/] with {result.build_system} in {result.build_seconds:.1f} s "
        f"(build tree {result.build_dir}, compile database {result.compdb})",
        highlight=False,
    )
    for note in result.notes:
        console.print(f"[yellow]note[/] {note}", highlight=False)
    _print_extract(result.extract, dest, verbose)


@corpus_app.command("build")
def build_cmd(
    src: Annotated[Path, typer.Argument(help="the source tree (CMake, Meson, autotools or plain Make)")],
    output: Output,
    opt: Opt = "-Oz",
    workers: Workers = None,
    build_system: Annotated[
        str | None, typer.Option("--build-system", help="cmake | meson | autotools | make (default: detect)")
    ] = None,
    configure_arg: Annotated[
        list[str] | None,
        typer.Option("--configure-arg", help="extra argument to cmake / meson setup / configure / make (repeatable)"),
    ] = None,
    strict: Annotated[bool, typer.Option("--strict", help="fail if any build step fails (no partial corpus)")] = False,
    include: Include = None,
    exclude: Exclude = None,
    keep_variants: KeepVariants = False,
    max_decisions: MaxDecisions = None,
    target: TargetTriple = None,
    target_flag: TargetFlags = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="list every entry left out")] = False,
) -> None:
    """Build any source tree with bitcode embedded (out of tree, logs in DIR/logs/) and extract a corpus.

    ``--target`` cross-compiles (CMake, Meson and autoconf are told so); a bare-metal target's objects are its
    corpus, as nothing links without the firmware's linker script."""
    from optgym.corpus.build import build_tree
    from optgym.errors import OptgymError
    from optgym.toolchain import find_toolchain

    chosen = _target(target, target_flag)
    try:
        result = build_tree(
            find_toolchain(),
            src,
            output,
            opt=opt,
            workers=workers,
            build_system=build_system,
            configure_args=configure_arg or (),
            include=include or (),
            exclude=exclude or (),
            keep_variants=keep_variants,
            strict=strict,
            max_decisions=max_decisions,
            target=chosen,
        )
    except OptgymError as e:
        _fail(str(e))
    _print_build(result, output, verbose)


_STATUS_STYLE = {"built": "green", "cached": "green", "not_found": "red", "fetch_failed": "red"}


@dataclass(frozen=True)
class _Progress:
    done: list

    def __call__(self) -> str:
        return ", ".join(f"{r.name} {r.status}" for r in self.done[-3:])


@corpus_app.command("debian")
def debian_cmd(
    packages: Annotated[list[str] | None, typer.Argument(help="Debian source packages (bookworm)")] = None,
    output: Output = Path("corpus-debian"),
    preset: Annotated[
        str | None, typer.Option("--preset", help="demo (three small packages) | train (the full training list)")
    ] = None,
    build_deps: Annotated[bool, typer.Option("--build-deps", help="apt-get build-dep each package first")] = False,
    opt: Opt = "-Oz",
    workers: Workers = None,
    keep_build: Annotated[
        bool, typer.Option("--keep-build", help="keep sources and build trees (default: delete once a package is done)")
    ] = False,
    include: Include = None,
    exclude: Exclude = None,
    max_decisions: MaxDecisions = None,
    add: Annotated[
        bool, typer.Option("--add", help="keep the packages OUTPUT already holds and add these (no rebuild)")
    ] = False,
    thinlto: Annotated[
        bool,
        typer.Option("--thinlto", help="build with -flto=thin and lld: the corpus is the backends of the real links"),
    ] = False,
    target: TargetTriple = None,
    target_flag: TargetFlags = None,
) -> None:
    """Fetch Debian source packages, build each with its upstream build system, merge them into one corpus.

    Module names are prefixed with the package; each package's exact source version is recorded. A package
    that is missing or fails is reported and the others go on; finished packages are not rebuilt. OUTPUT ends
    up holding exactly the packages named (finished ones stay cached in its work directory): name them all
    again, or give ``--add`` to keep what it holds and add the new ones.
    """
    from optgym.corpus import debian
    from optgym.errors import OptgymError
    from optgym.parallel import run_tasks

    names = list(packages or [])
    if preset:
        if preset not in debian.PRESETS:
            _fail(f"unknown preset {preset!r}; one of {', '.join(debian.PRESETS)}")
        names += [p for p in debian.PRESETS[preset] if p not in names]
    if add:
        held = debian.held_packages(output)
        names = held + [n for n in names if n not in held]
    if not names:
        _fail("name some packages, or --preset demo|train")
    chosen = _target(target, target_flag)
    if chosen is not None and thinlto:
        _fail("--thinlto builds for this machine only: cross ThinLTO links are not captured yet")
    output = output.absolute()
    try:
        written = debian.enable_deb_src(output / "logs" / "apt-update.log")
    except OptgymError as e:
        _fail(str(e))
    if written:
        console.print(f"[yellow]apt had no deb-src entry:[/] wrote {written} and ran apt-get update", highlight=False)
    triple, flags = (chosen.triple, chosen.flags) if chosen else (None, ())
    tasks = [
        debian.PackageTask(n, str(output), opt, workers, build_deps, keep_build, thinlto, triple, flags) for n in names
    ]
    results: list = []
    # one package at a time: each build already uses every worker (make -j/ninja -j)
    for _, result in run_tasks(
        debian.build_package, tasks, workers=1, description="packages", status=_Progress(results)
    ):
        results.append(result)
    table = Table(title=f"Debian packages → {output}")
    for col in ("package", "version", "build", "modules", "seconds", "status"):
        table.add_column(col, justify="right" if col in ("modules", "seconds") else "left")
    for r in results:
        style = _STATUS_STYLE.get(r.status, "yellow")
        table.add_row(r.name, r.version, r.build_system, str(r.modules) if r.ok else "—", f"{r.seconds:.0f}",
                      f"[{style}]{r.status}[/]")  # fmt: skip
    console.print(table)
    for r in results:
        if not r.ok:
            console.print(f"[red]{r.name}[/]: {r.detail}\n    log: {r.log}", highlight=False, soft_wrap=True)
        for note in r.notes:
            console.print(f"[yellow]{r.name}[/]: {note}", highlight=False, soft_wrap=True)
    built = [r for r in results if r.ok]
    if not built:
        _fail("no package was built")
    try:
        modules, _ = debian.merge_packages(output, results, include=include or (), exclude=exclude or (),
                                           max_decisions=max_decisions, workers=workers)  # fmt: skip
    except OptgymError as e:
        _fail(str(e))
    console.print(
        f"[bold green]corpus[/] {output}: {modules} modules from {len(built)} of {len(results)} packages",
        highlight=False,
    )
    _print_left_out(output)


@corpus_app.command("csmith")
def csmith_cmd(
    count: Annotated[int, typer.Option("-n", "--count", help="how many programs (re-running with more adds the rest)")],
    output: Output,
    seed: Annotated[int, typer.Option("--seed", help="the same seed gives the same programs")] = 0,
    opt: Opt = "-Oz",
    workers: Workers = None,
) -> None:
    """Random C programs from Debian's csmith, compiled with bitcode embedded: robustness tests, extra data.

    Program i of --seed S is always the same program, so a corpus is reproducible and growing -n only
    adds programs. A program that csmith or clang fails on is reported, recorded and retried next time.
    """
    from optgym.corpus.csmith import build_csmith_corpus
    from optgym.errors import OptgymError
    from optgym.toolchain import find_toolchain

    try:
        report = build_csmith_corpus(find_toolchain(), output, count=count, seed=seed, opt=opt, workers=workers)
    except OptgymError as e:
        _fail(str(e))
    console.print(
        f"[bold green]corpus[/] {output}: {report.modules} csmith modules ({report.new} new, {report.reused} "
        f"reused; csmith {report.csmith}, seed {seed}) in {report.seconds:.1f} s",
        highlight=False,
    )
    if report.failed:
        console.print(f"[yellow]{len(report.failed)} programs failed[/] (retried on the next run):", highlight=False)
        for r in report.failed[:20]:
            console.print(f"  {r.name} (csmith seed {r.seed}): {r.status}: {r.detail[:300]}", highlight=False)


Split = Annotated[str | None, typer.Option("--split", help="train | test: one side of the stored split")]


@corpus_app.command("split")
def split_cmd(
    corpus: Annotated[Path, typer.Argument(help="corpus directory")],
    test_percent: Annotated[float, typer.Option("--test-percent", help="share of groups held out for test")] = 10.0,
    seed: Annotated[int, typer.Option("--seed", help="the same seed gives the same split")] = 0,
    by: Annotated[
        str, typer.Option("--by", help="package (default; a module split leaks a package's templates) | module")
    ] = "package",
    test_groups: Annotated[
        str | None,
        typer.Option("--test-groups", help="these packages (comma-separated) are the test side, not a seeded draw"),
    ] = None,
) -> None:
    """Store a deterministic train/test split in the corpus description (no copying)."""
    from optgym.corpus.split import apply_split
    from optgym.errors import OptgymError

    groups = [g.strip() for g in (test_groups or "").split(",") if g.strip()]
    try:
        record = apply_split(corpus, test_percent=test_percent, seed=seed, by=by, test_groups=groups)
    except OptgymError as e:
        _fail(str(e))
    if record["by"] != by:
        console.print(f"[yellow]note[/] {corpus} records no packages: split by {record['by']}", highlight=False)
    tested = f" (test packages: {', '.join(record['test_groups'])})" if record["test_groups"] else ""
    console.print(
        f"[bold green]split[/] {corpus}: {record['train_modules']} train, {record['test_modules']} test modules, "
        f"by {record['by']}, seed {seed}{tested}",
        highlight=False,
    )


@corpus_app.command("info")
def info_cmd(
    corpus: Annotated[Path, typer.Argument(help="corpus directory")],
    split: Split = None,
    sizes: Annotated[bool, typer.Option("--sizes/--no-sizes", help="compile every module with the heuristic")] = True,
    decisions: Annotated[
        bool, typer.Option("--decisions", help="also count decisions (an interactive compile per module, cached)")
    ] = False,
    workers: Workers = None,
    problem: Annotated[str, typer.Option(help="decision problem whose heuristic sizes are reported")] = "inline-size",
    json_out: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
    modules: Annotated[bool, typer.Option("--modules", help="list every module with its target")] = False,
) -> None:
    """Modules, languages, opt levels, targets, bitcode bytes and heuristic size totals (per package when there are
    any); ``--modules`` lists each module's target (its ``-cc1 -triple``)."""
    import json

    from optgym.corpus.info import corpus_info, describe_opt_mismatches
    from optgym.errors import OptgymError

    try:
        info = corpus_info(
            corpus,
            split=split,
            sizes=sizes,
            decisions=decisions,
            workers=workers,
            problem=problem,
            progress=not json_out,
        )
    except OptgymError as e:
        _fail(str(e))
    if json_out:
        print(json.dumps(info, indent=2))
        return
    side = f" ({split} split)" if split else ""
    console.print(f"[bold]corpus[/] {info['root']}{side}: {info['modules']} modules", highlight=False)
    console.print("[bold]languages[/] " + ", ".join(f"{k} {v}" for k, v in info["languages"].items()), highlight=False)
    console.print(
        "[bold]opt levels[/] " + ", ".join(f"{k} {v}" for k, v in info["opt_levels"].items()), highlight=False
    )
    console.print("[bold]targets[/] " + ", ".join(f"{k} {v}" for k, v in info["targets"].items()), highlight=False)
    if modules:
        table = Table(title="modules")
        for col in ("module", "target"):
            table.add_column(col)
        for name, triple in info["module_targets"].items():
            table.add_row(name, triple)
        console.print(table)
    if warning := describe_opt_mismatches(info["opt_mismatches"], info["modules"], info["requested_opt"]):
        console.print(f"[bold yellow]warning[/] {warning}", highlight=False, soft_wrap=True)
    console.print(f"[bold]bitcode[/] {info['bitcode_bytes'] / 1e6:.2f} MB", highlight=False)
    h = info["heuristic"]
    if h:
        console.print(
            f"[bold]heuristic ({h['problem']})[/] text {h.get('text_bytes', 0)} B, .text {h.get('dottext_bytes', 0)} B"
            + (f", [red]{h['failed']} modules failed to compile[/]" if h["failed"] else ""),
            highlight=False,
        )
        for row in h["failures"]:
            console.print(f"  [red]{row['module']}[/]: {row['status']} {row['detail']}", highlight=False)
    d = info["decisions"]
    if d:
        console.print(
            f"[bold]decisions ({d['problem']})[/] {d.get('decisions', 0)}, the heuristic says yes to "
            f"{d.get('heuristic_yes', 0)}" + (f", [red]{d['failed']} modules failed[/]" if d["failed"] else ""),
            highlight=False,
        )
    if info["stored_split"]:
        s = info["stored_split"]
        console.print(
            f"[bold]split[/] by {s['by']}, seed {s['seed']}: {s['train_modules']} train / {s['test_modules']} test"
            + (f" (test: {', '.join(s['test_groups'])})" if s.get("test_groups") else ""),
            highlight=False,
        )
    if info["packages"]:
        table = Table(title="packages")
        for col in ("package", "version", "target", "modules", "C", "C++", "bitcode KB", "heuristic text B"):
            table.add_column(col, justify="left" if col in ("package", "version", "target") else "right")
        for name, p in info["packages"].items():
            table.add_row(name, p.get("version", ""), ", ".join(p["targets"]), str(p["modules"]),
                          str(p["languages"].get("C", 0)),
                          str(p["languages"].get("C++", 0)), f"{p['bitcode_bytes'] / 1e3:.0f}",
                          str(p.get("text_bytes", "—")))  # fmt: skip
        console.print(table)


@corpus_app.command("merge")
def merge_cmd(
    inputs: Annotated[list[Path], typer.Argument(help="corpora to merge")],
    output: Output,
    prefix: Annotated[
        bool, typer.Option("--prefix", help="prefix each input's modules with its directory name")
    ] = False,
    include: Include = None,
    exclude: Exclude = None,
    max_decisions: MaxDecisions = None,
    workers: Workers = None,
) -> None:
    """Merge corpora into one (hard links, no copies); --include/--exclude filter modules by glob."""
    from optgym.corpus.merge import merge_corpora
    from optgym.errors import OptgymError

    try:
        merged = merge_corpora(inputs, output, include=include or (), exclude=exclude or (), prefix=prefix,
                               max_decisions=max_decisions, workers=workers)  # fmt: skip
    except OptgymError as e:
        _fail(str(e))
    console.print(f"[bold green]corpus[/] {output}: {len(merged)} modules from {len(inputs)} corpora", highlight=False)
    _print_left_out(output)


__all__ = ["Table", "corpus_app"]


@corpus_app.command("thinlto")
def thinlto_cmd(
    objects: Annotated[
        list[Path] | None, typer.Argument(help="bitcode objects of a -flto=thin build (or --from a corpus)")
    ] = None,
    output: Output = Path("corpus-thinlto"),
    build: Annotated[
        Path | None,
        typer.Option("--build", help="a source tree: build it with -flto=thin and lld, and take its links' backends"),
    ] = None,
    configure_arg: Annotated[
        list[str] | None, typer.Option("--configure-arg", help="with --build: for the configure step (repeatable)")
    ] = None,
    source: Annotated[
        Path | None, typer.Option("--from", help="a per-TU corpus: link each package's programs from its modules")
    ] = None,
    split: Split = None,
    language: Annotated[str, typer.Option("--language", help="with --from: C | C++ | all")] = "C",
    packages: Annotated[
        str | None, typer.Option("--packages", help="with --from: only these (comma-separated)")
    ] = None,
    max_programs: Annotated[
        int, typer.Option("--max-programs", help="with --from: programs per package, chosen to cover most modules")
    ] = 3,
    link_arg: Annotated[
        list[str] | None, typer.Option("--link-arg", help="with objects: passed to the index-only link (repeatable)")
    ] = None,
    opt: Annotated[
        str, typer.Option("--opt", help="with objects and --build: the compile level (--from keeps each module's own)")
    ] = "-Oz",
    workers: Workers = None,
) -> None:
    """A corpus of distributed-ThinLTO backend compiles (MLGO's ``--thinlto_build=distributed``).

    Each module is one backend: its pre-link bitcode, the index its program's link wrote, and the
    backend ``-cc1``. ``--build SRC``: every link of a real ``-flto=thin`` build of the tree, as it ran.
    From objects: one link of all of them. ``--from`` a per-TU corpus: each module is
    pre-linked from its bitcode and command, and each package's programs (modules defining ``main``)
    are linked against the rest of the package as an archive; a package without one as a shared library.
    """
    from optgym.corpus.corpus import Corpus
    from optgym.corpus.thinlto import corpus_from_build, corpus_from_corpus, corpus_from_objects
    from optgym.errors import OptgymError

    if sum(map(bool, (objects, source, build))) != 1:
        _fail("give one of: bitcode objects, --from CORPUS, --build SRC")
    try:
        if build is not None:
            count = corpus_from_build(build, output, opt=opt, workers=workers, configure_args=configure_arg or [])
        elif source is not None:
            chosen = [p.strip() for p in packages.split(",") if p.strip()] if packages else None
            count = corpus_from_corpus(Corpus(source, split=split), output, language=None if language == "all" else
                                       language, packages=chosen, max_programs=max_programs,
                                       workers=workers)  # fmt: skip
        else:
            count = corpus_from_objects(objects or [], output, link_arg or [], opt)
    except OptgymError as e:
        _fail(str(e))
    console.print(f"[bold green]corpus[/] {output}: {count} ThinLTO backends", highlight=False, soft_wrap=True)
