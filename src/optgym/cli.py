"""The ``optgym`` command line. Every command that fans out takes ``--workers/-j`` (``--parallel``)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

import optgym.rollout  # noqa: F401  (registers the heuristic workers of `optgym corpus info` and --max-decisions)
from optgym.corpus.cli import corpus_app
from optgym.errors import OptgymError
from optgym.evaluate.benchmark import benchmark_app
from optgym.train.cli import Companions, parse_companions, search_command, trace_command, train_app, vocab_command

if TYPE_CHECKING:
    from optgym.corpus import Corpus

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
app.add_typer(corpus_app, name="corpus")
app.add_typer(train_app, name="train")
app.add_typer(benchmark_app, name="benchmark")
app.command("trace")(trace_command)
app.command("vocab")(vocab_command)
app.command("search")(search_command)  # top-level, and also `optgym train search`
console = Console(emoji=False)
err = Console(stderr=True, soft_wrap=True, emoji=False)

Workers = Annotated[
    int | None, typer.Option("--workers", "-j", "--parallel", help="worker processes (default: all cores)")
]


def _fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


@app.callback()
def _global_options(
    ray_address: Annotated[
        str | None,
        typer.Option("--ray-address", help="run every fan-out on a Ray cluster: auto | HOST:PORT (the ray extra)"),
    ] = None,
) -> None:
    """Options for every command: set here once, so each fan-out picks them up without its own flag."""
    if ray_address:
        from optgym.parallel import RAY_ADDRESS_ENV, check_ray_address

        try:
            os.environ[RAY_ADDRESS_ENV] = check_ray_address(ray_address)
        except OptgymError as e:
            _fail(str(e))


def _doctor_line(text: str) -> None:
    """One doctor finding per line, never wrapped: a path can make a line longer than the terminal (or than rich's
    80 columns when stdout is a pipe), and a finding split over two lines no longer greps."""
    console.print(text, highlight=False, soft_wrap=True)


def _doctor_compilers(bin_dir: Path) -> bool:
    """Whether the drop-in compilers beside this interpreter work: each front door (a ``/bin/sh`` script) answers
    ``--version`` as clang-22 itself, and the Python launcher it hands served steps to is there. A build that
    names ``CC=optgym-cc`` fails at its first step otherwise, so say it here first."""
    import subprocess

    launcher = os.access(bin_dir / "optgym-cc-launcher", os.X_OK)
    ok = True
    for name in ("optgym-cc", "optgym-c++"):
        front = bin_dir / name
        try:
            done = subprocess.run([str(front), "--version"], capture_output=True, text=True, timeout=30)
            works = launcher and done.returncode == 0 and "clang version 22." in done.stdout
        except OSError:
            works = False
        answer = "[green]runs clang-22[/]" if works else "[red]broken: reinstall optgym (pip install -e .)[/]"
        _doctor_line(f"compiler   {name:18s} {front}  {answer}")
        ok &= works
    return ok


def _cache_summary() -> str:
    from optgym.files import cache_root, cache_usage

    usage = {name: size for name, size in cache_usage().items() if size}
    parts = ", ".join(f"{name} {_megabytes(size)}" for name, size in usage.items())
    held = f"{_megabytes(sum(usage.values()))} ({parts}); any part may be deleted, at the price of recompiling it"
    return f"{cache_root()}  {held if usage else 'empty'}"


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.0f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB" if size >= 1e3 else f"{size} B"


@app.command()
def doctor() -> None:
    """Say what optgym found: clang, its version and the MLGO hook of every decision problem, the LLVM tools,
    whether the drop-in compilers run, Python packages."""
    from optgym.errors import ToolchainError
    from optgym.problems import registry
    from optgym.toolchain.llvm import find_toolchain

    ok = True
    try:
        tc = find_toolchain()
        _doctor_line(f"clang      {tc.clang}  ({tc.banner})")
        for name, problem in registry().items():  # the hooks the problems declare: a new problem's is checked too
            present = tc.accepts(problem.hook)
            answer = "[green]yes[/]" if present else "[red]no[/]"
            _doctor_line(f"hook       {problem.hook.name:18s} {answer}  {name}")
            ok &= present or problem.hook.name != "inliner"  # inlining is what optgym does first; the rest may lack
        for tool in ("llvm-objcopy", "llvm-size"):
            try:
                _doctor_line(f"tool       {tool:18s} {tc.tool(tool)}")
            except ToolchainError as e:
                _doctor_line(f"tool       {tool:18s} [red]missing[/] {e}")
                ok = False
        from optgym.toolchain.lanes import lanes_library

        lanes = lanes_library(str(tc.clang))  # a served ThinLTO link's backends side by side inside lld
        _doctor_line(f"lanes      {lanes or '[yellow]not built: served ThinLTO backends run one at a time[/]'}")
        from optgym.toolchain.pass_plugin import surviving_plugin

        plugin = surviving_plugin(tc)  # a linkage policy's compile reads its surviving functions from inside clang
        _doctor_line(f"plugin     {plugin or '[yellow]not built (llvm-22-dev?): linkage compiles split[/]'}")
    except ToolchainError as e:
        _doctor_line(f"clang      [red]{e}[/]")
        ok = False
    ok &= _doctor_compilers(Path(sys.executable).parent)
    _doctor_line(f"setpriv    {shutil.which('setpriv') or '[yellow]missing: falls back to preexec_fn[/]'}")
    _doctor_line(f"cache      {_cache_summary()}")
    _doctor_line(f"python     {sys.version.split()[0]}")
    for dist in ("gymnasium", "numpy", "typer", "rich"):
        try:
            _doctor_line(f"package    {dist:18s} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            _doctor_line(f"package    {dist:18s} [red]missing[/]")
            ok = False
    if not ok:
        raise typer.Exit(1)


@app.command()
def replay(
    transcript: Path,
    limit: Annotated[int, typer.Option(help="decisions to print (0: all)")] = 0,
    all_features: Annotated[bool, typer.Option("--all-features", help="print zero-valued features too")] = False,
) -> None:
    """Print a transcript recorded with OPTGYM_TRANSCRIPT / --transcript readably."""
    from optgym.protocol import Context, Header, Observation, ProtocolError, StreamDecoder
    from optgym.protocol.transcript import read_transcript

    try:
        t = read_transcript(transcript)
    except (OSError, ProtocolError) as e:
        _fail(f"{transcript}: {e}")
    console.print(f"[bold]meta[/] {json.dumps(t.meta, sort_keys=True)}")
    decoder = StreamDecoder()
    decoder.feed(t.out)
    shown = 0
    try:
        for event in decoder.events():
            if isinstance(event, Header):
                names = ", ".join(f"{s.name}:{s.type}{list(s.shape)}" for s in event.features)
                console.print(f"[bold]header[/] {len(event.features)} features: {names}", highlight=False)
                console.print(f"[bold]advice[/] {event.advice}", highlight=False)
            elif isinstance(event, Context):
                console.print(f"[bold]context[/] {event.name!r}")
            elif isinstance(event, Observation):
                if limit and shown >= limit:
                    continue
                values = {k: v.tolist() for k, v in event.as_dict().items()}
                shown_values = {k: (v[0] if len(v) == 1 else v) for k, v in values.items() if all_features or any(v)}
                answer = t.answers[event.index] if event.index < len(t.answers) else None
                reply = (
                    "—"
                    if answer is None
                    else (int.from_bytes(answer, sys.byteorder, signed=True) if len(answer) <= 8 else answer.hex())
                )
                console.print(f"#{event.index:<5} answer={reply}  {shown_values}", highlight=False)
                shown += 1
        decoder.close()
    except ProtocolError as e:
        console.print(f"[red]stream error:[/] {e}")
    console.print(f"[bold]answers[/] {len(t.answers)}")
    if t.stderr.strip():
        console.print("[bold]compiler stderr[/]\n" + t.stderr.rstrip(), highlight=False)
    console.print(f"[bold]end[/] {json.dumps(t.end)}" if t.complete else "[yellow]transcript ends abruptly[/]")


def _print_summary(report: dict, title: str) -> None:
    from optgym.train.evaluation import GUARD_BELOW

    table = Table(title=title)
    for col in ("", "heuristic", "policy", "ratio"):
        table.add_column(col, justify="left" if not col else "right")
    table.add_row("Berkeley text", str(report["heuristic_text_bytes"]), str(report["policy_text_bytes"]),
                  f"{report['total_ratio']:.4f}" if report["total_ratio"] else "—")  # fmt: skip
    table.add_row(".text", str(report["heuristic_dottext_bytes"]), str(report["policy_dottext_bytes"]),
                  f"{report['dottext_ratio']:.4f}" if report["dottext_ratio"] else "—")  # fmt: skip
    if report.get("text_and_data_ratio"):
        table.add_row("Berkeley text + data", "", "", f"{report['text_and_data_ratio']:.4f}")
    if report["never_inline_text_bytes"] is not None:
        table.add_row("never inline", "", str(report["never_inline_text_bytes"]), "")
    if report.get("guarded_ratio"):
        table.add_row("guarded (OPTGYM_GUARD=1)", "", "", f"{report['guarded_ratio']:.4f}")
    if report.get("guarded_below_ratio"):
        table.add_row(f"guarded below {GUARD_BELOW} B ({report['guarded_below_over_1pct']} > 1 % worse)", "", "",
                      f"{report['guarded_below_ratio']:.4f}")  # fmt: skip
    console.print(table)
    geomean = f"{report['geomean_ratio']:.4f}" if report["geomean_ratio"] else "—"
    console.print(
        f"modules {report['modules']}: improved {report['improved']}, regressed {report['regressed']}, "
        f"same {report['same']}, failed {report['failed']}; geomean ratio {geomean}"
    )
    for failure in report["failures"]:
        console.print(f"[red]failed[/] {failure['module']}: {failure['status']}: {failure['detail']}", highlight=False)


def sample_modules(corpus: Corpus, language: str | None, every: int) -> list[str] | None:
    """The modules ``optgym evaluate`` compiles: every one (None), one language's, and of those every ``every``-th
    by name. A fixed sample of a training side is how a recipe is checked against a baseline on the code it was
    trained on, at a fraction of the compiles, before any unseen set is spent on it."""
    from optgym.train.run import check_language, every_kth, of_language

    check_language(language)
    if every < 1:
        raise OptgymError(f"--every {every}: a positive step (1: every module)")
    if language is None and every == 1:
        return None
    chosen = every_kth((m.name for m in of_language(corpus, language)), every)
    if not chosen:
        kind = f"{language} " if language else ""
        raise OptgymError(f"{corpus.root} has no {kind}modules (split {corpus.split})")
    return chosen


def corpus_triple(corpus: Corpus, modules: list[str] | None) -> str | None:
    """The one target the chosen modules were compiled for (their ``-cc1 -triple``), ``None`` if unrecorded."""
    from optgym.corpus.info import raw_cc1_args
    from optgym.corpus.target import module_triple

    chosen = [corpus.module(n) for n in modules] if modules is not None else list(corpus)
    triples = {module_triple(raw_cc1_args(m)) for m in chosen}
    if len(triples) > 1:
        raise OptgymError(f"{corpus.root} holds modules for {len(triples)} targets "
                          f"({', '.join(sorted(str(t) for t in triples))}): evaluate one target at a time")  # fmt: skip
    return next(iter(triples), None)


def served_file(spec: str, name: str, triple: str | None) -> str:
    """What optgym-cc serves as ``spec`` to a compile for ``triple``: ``pretrained`` becomes the file ``name`` shipped
    for that target (AArch64's own inliner…), chosen by the launcher's own lookup, so ``optgym evaluate`` measures
    the file a build of that target gets; for a target that ships none, ``heuristic``, clang's own decisions, as
    its build gets them (with one note, as optgym-cc prints). Any other spec, and ``pretrained`` for x86-64 (the
    package's own files), is itself."""
    from optgym_cc import PORTFOLIO, SHIPPED_FAMILY, shipped_policy, triple_target

    if spec != "pretrained" or triple is None or not name:
        return spec
    target = triple_target(triple)
    if target[1] == SHIPPED_FAMILY:
        return spec
    path = shipped_policy(name, target)
    if path is None:
        portfolio = shipped_policy(PORTFOLIO, target)
        and_c = f"; its C compiles take its portfolio with --candidates N ({portfolio})" if portfolio else ""
        err.print(
            f"note: optgym ships no {name} for {target[1]} (the modules' target {triple}): a build for it "
            f"leaves that decision to clang, so clang's is measured (heuristic){and_c}",
            highlight=False,
        )
        return "heuristic"
    return path


@app.command()
def evaluate(
    corpus: Annotated[Path, typer.Option(help="corpus directory")],
    policy: Annotated[str, typer.Option(help="heuristic | never | always | random[:SEED] | a trained policy")] = (
        "heuristic"
    ),
    report: Annotated[Path, typer.Option("--report", "-o", help="output directory")] = Path("report"),
    split: Annotated[str | None, typer.Option(help="train | test: the corpus's stored split")] = None,
    problem: Annotated[str, typer.Option(help="decision problem")] = "inline-size",
    language: Annotated[str | None, typer.Option(help="only the C or only the C++ modules")] = None,
    every: Annotated[
        int, typer.Option(help="only every K-th module by name (after --split, --language): a fixed sample")
    ] = 1,
    workers: Workers = None,
    mode: Annotated[str, typer.Option(help="eval: greedy policy; collect: sampled")] = "eval",
    seed: Annotated[int, typer.Option(help="seed of stochastic policies")] = 0,
    timeout: Annotated[float, typer.Option(help="seconds of compiler time per module")] = 120.0,
    transcript: Annotated[Path | None, typer.Option(help="record every exchange in this directory")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print report.json to stdout")] = False,
    all_snapshots: Annotated[
        bool, typer.Option("--all-snapshots", help="POLICY is a run: evaluate every snapshot too (the snapshot curve)")
    ] = False,
    with_: Companions = None,
    candidates: Annotated[
        int,
        typer.Option(
            help="compile each C module as optgym-cc does with OPTGYM_CANDIDATES=N: the shipped "
            "portfolio's first N candidates, the smallest kept (0: the policies alone)"
        ),
    ] = 0,
    portfolio: Annotated[
        Path | None, typer.Option(help="with --candidates: this portfolio file instead of the shipped one")
    ] = None,
) -> None:
    """Compile a corpus with a policy and with clang's heuristic; write report.json, modules.csv, report.md, plots.

    With ``--with regalloc-evict=POLICY`` the policy's compiles also have their register allocation
    decided by POLICY, and the comparison is both policies together against clang alone. With
    ``--candidates N`` the portfolio's language (C) is compiled by the shipped portfolio instead, as
    ``optgym-cc`` builds it with ``OPTGYM_CANDIDATES=N`` (unset, it compiles the portfolio's
    ``default_candidates``: 2 for the shipped one)."""
    from optgym import __version__
    from optgym.corpus import Corpus
    from optgym.evaluate import evaluate as run_evaluation
    from optgym.evaluate.report import write_report
    from optgym.policies import pretrained_names, resolve_policy
    from optgym.policies.portfolio import PRETRAINED_PORTFOLIO, load_portfolio
    from optgym.problems import get_problem
    from optgym.toolchain import find_toolchain

    try:
        corpus_obj = Corpus(corpus, split=split)
        modules = sample_modules(corpus_obj, language, every)
        # the target matters only where it chooses a shipped file: a corpus of several targets is fine otherwise
        by_target = policy == "pretrained" or (candidates and portfolio is None)
        triple = corpus_triple(corpus_obj, modules) if by_target else None
        served = served_file(policy, pretrained_names().get(problem, ""), triple)
        if served not in (policy, "heuristic"):
            err.print(f"pretrained {problem} for {triple}: {served}", highlight=False)
        factory = resolve_policy(served, problem)
        companions = parse_companions(with_)
        if candidates and portfolio is None:  # the portfolio a build for this target compiles with
            chosen_file = served_file("pretrained", PRETRAINED_PORTFOLIO.name, triple)
            portfolio = PRETRAINED_PORTFOLIO if chosen_file == "pretrained" else Path(chosen_file)
        hooks = [get_problem(name).hook for name in (problem, *(name for name, _ in companions))]
        toolchain = find_toolchain(tuple(hooks))
        rows = run_evaluation(served, corpus_obj, problem=problem, modules=modules, workers=workers, mode=mode,
                              seed=seed, timeout=timeout, progress=not json_out, transcript_dir=transcript,
                              companions=companions, candidates=candidates,
                              portfolio=load_portfolio(portfolio) if portfolio else None)  # fmt: skip
        snapshots = None
        if all_snapshots:
            from optgym.evaluate import summarize
            from optgym.policies.trained import snapshot_dirs

            snapshots = []
            for snap in snapshot_dirs(Path(policy)):
                snap_rows = run_evaluation(str(snap), corpus_obj, problem=problem, modules=modules, workers=workers,
                                           mode=mode, seed=seed, timeout=timeout, progress=not json_out)  # fmt: skip
                snapshots.append({"snapshot": snap.name, **summarize(snap_rows)})
            if not snapshots:
                _fail(f"{policy} has no snapshots (expected {policy}/snapshots/<iteration>/policy)")
    except OptgymError as e:
        _fail(str(e))
    identity: dict[str, Any] = {"policy": policy, "policy_file": served, "policy_identity": factory.identity,
                "problem": problem, "mode": mode,
                "with": {name: resolve_policy(spec, name).identity for name, spec in companions},
                "corpus": str(corpus), "split": split, "language": language, "every": every,
                "compiler": toolchain.banner, "optgym": __version__}  # fmt: skip
    if candidates:
        from optgym.policies import file_identity

        chosen = portfolio or PRETRAINED_PORTFOLIO
        identity["candidates"] = {"count": candidates, "portfolio": str(chosen), "identity": file_identity(chosen)}
    result = write_report(report, rows, identity, snapshots)
    if json_out:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        _print_summary(result, f"{policy} vs heuristic ({problem}) on {corpus}")
        console.print(f"report: {report / 'report.md'}")
    if result["evaluated"] and not result["heuristic_text_bytes"]:
        # one module without code is a data file; a corpus without any is a compile that produced nothing
        # (a ThinLTO backend whose index did not name its module did so once) — no ratio to report
        evaluated = result["evaluated"]
        _fail(f"every module evaluated ({evaluated}) compiled to an object without code (Berkeley text 0 B): "
              "nothing was compared; check that compiling the corpus's commands by hand yields code")  # fmt: skip


@app.command()
def diff(
    corpus: Annotated[Path, typer.Option(help="corpus directory")],
    module: Annotated[str, typer.Option(help="module name in the corpus")],
    policy: Annotated[str, typer.Option(help="the policy to compare with the heuristic")],
    problem: Annotated[str, typer.Option(help="decision problem")] = "inline-size",
    seed: Annotated[int, typer.Option(help="seed of stochastic policies")] = 0,
    limit: Annotated[int, typer.Option(help="call sites to print (0: all)")] = 50,
    json_out: Annotated[bool, typer.Option("--json", help="print the diff as JSON")] = False,
) -> None:
    """The call sites where POLICY and the heuristic decided differently, named from clang's remarks."""
    from dataclasses import asdict

    from optgym.corpus import Corpus
    from optgym.evaluate.diff import demangle, diff_module

    try:
        result = diff_module(policy, Corpus(corpus)[module], problem=problem, seed=seed)
    except (OptgymError, RuntimeError) as e:
        _fail(str(e))
    if json_out:
        print(json.dumps(asdict(result), indent=2))
        return
    ratio = result.policy_text / result.heuristic_text if result.heuristic_text else float("nan")
    console.print(f"[bold]{module}[/]: Berkeley text {result.heuristic_text} → {result.policy_text} ({ratio:.4f}), "
                  f".text {result.heuristic_dottext} → {result.policy_dottext}; "
                  f"{len(result.sites)} call sites decided differently")  # fmt: skip
    names = demangle(sorted({n for s in result.sites for n in (s.site.caller, s.site.callee)}))
    table = Table(show_lines=False)
    for col in ("caller", "callee", "location", "heuristic", "policy"):
        table.add_column(col, overflow="fold")
    shown = result.sites if not limit else result.sites[:limit]
    for s in shown:
        table.add_row(names[s.site.caller], names[s.site.callee], s.site.location or "—",
                      f"inlined {s.heuristic_inlined} / kept {s.heuristic_kept}",
                      f"inlined {s.policy_inlined} / kept {s.policy_kept}")  # fmt: skip
    console.print(table)
    if len(shown) < len(result.sites):
        console.print(f"… {len(result.sites) - len(shown)} more (--limit 0 for all)")


@app.command()
def export(
    run: Annotated[Path, typer.Argument(help="a training run, snapshot or policy directory")],
    output: Annotated[Path, typer.Option("-o", "--output", help="the policy file to write (*.onnx)")],
) -> None:
    """A trained policy as one self-contained ONNX file (network and normalization, or a candidate scorer;
    metadata) for OPTGYM_POLICY / OPTGYM_EVICT_POLICY."""
    from optgym.policies.export import SUFFIX, export_policy

    if output.suffix != SUFFIX:
        _fail(f"-o must name a {SUFFIX} file (that suffix is how --policy and OPTGYM_POLICY recognise it)")
    try:
        meta = export_policy(run, output)
    except OptgymError as e:
        _fail(str(e))
    prov = meta["provenance"]
    shapes = {"candidate-scorer": "a candidate scorer", "log-linear-scorer": "a log-linear scorer",
              "residual-scorer": "a residual scorer"}  # fmt: skip
    shape = f"hidden {meta['network']['hidden']}" if "network" in meta else shapes[meta["form"]]
    summary = (
        f"{output}: {meta['problem']} policy, {len(meta['features'])} features, {shape}, "
        f"{prov.get('algorithm') or 'unknown algorithm'}, trained with {meta['compiler'] or 'an unrecorded compiler'}"
    )
    console.print(summary, highlight=False, soft_wrap=True)


@app.command("results-page")
def results_page(
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="write the page here (default: stdout, unless --readme)")
    ] = None,
    readme: Annotated[
        Path | None, typer.Option("--readme", help="also regenerate this README's results block (its marker lines)")
    ] = None,
) -> None:
    """The results page (docs/results.md), generated from the shipped provenance files and the C portfolio."""
    from optgym.evaluate.results_page import PRETRAINED_DIR, with_readme_results
    from optgym.evaluate.results_page import results_page as generate
    from optgym_cc.thinlto import served_by_default

    if readme is not None:
        try:
            readme.write_text(with_readme_results(readme.read_text(), PRETRAINED_DIR, served_by_default()))
        except (OSError, ValueError) as e:
            _fail(f"{readme}: {e}")
        console.print(f"{readme}: results block regenerated", highlight=False)
        if output is None:  # the README was asked for, not the page
            return
    text = generate()
    if output is None:
        print(text, end="")
        return
    output.write_text(text)
    console.print(f"{output}: {len(text.splitlines())} lines", highlight=False)


@app.command("compare-sizes")
def compare_sizes(
    build_a: Annotated[Path, typer.Argument(help="first build directory")],
    build_b: Annotated[Path, typer.Argument(help="second build directory")],
    field: Annotated[str, typer.Option(help="text (Berkeley) | code (.text*) | file (bytes on disk)")] = "text",
    json_out: Annotated[bool, typer.Option("--json", help="print rows as JSON")] = False,
) -> None:
    """Linked executables and shared libraries of two builds, matched by path, with totals."""
    from optgym.evaluate.elf_sizes import FIELDS, compare_builds

    if field not in FIELDS:
        _fail(f"--field must be one of {', '.join(FIELDS)}")
    rows = compare_builds(build_a, build_b, field)
    if not rows:
        _fail(f"no linked ELF files in {build_a} or {build_b}")
    both = [r for r in rows if r.a is not None and r.b is not None]
    total_a, total_b = sum(r.a for r in both), sum(r.b for r in both)  # type: ignore[misc]
    if json_out:
        print(json.dumps({"field": field, "rows": [r.__dict__ for r in rows], "total_a": total_a, "total_b": total_b,
                          "ratio": total_b / total_a if total_a else None}, indent=2))  # fmt: skip
        return
    table = Table(title=f"{field} bytes: {build_a} → {build_b}")
    for col in ("file", "A", "B", "B/A"):
        table.add_column(col, justify="left" if col == "file" else "right")
    for r in rows:
        ratio = f"{r.b / r.a:.4f}" if r.a and r.b is not None else "—"
        table.add_row(r.path, "—" if r.a is None else str(r.a), "—" if r.b is None else str(r.b), ratio)
    table.add_section()
    table.add_row(f"total ({len(both)} in both)", str(total_a), str(total_b),
                  f"{total_b / total_a:.4f}" if total_a else "—")  # fmt: skip
    console.print(table)


@app.command("compare-build")
def compare_build(
    source: Annotated[Path, typer.Argument(help="the project's source tree (left untouched)")],
    lto: Annotated[str | None, typer.Option(help="thin | full: both builds with -flto=MODE, linked by lld")] = None,
    test: Annotated[bool, typer.Option("--test", help="run the project's test suite in both builds")] = False,
    target: Annotated[str | None, typer.Option(help="a target triple (--target=TRIPLE) for both builds")] = None,
    target_flag: Annotated[
        list[str] | None,
        typer.Option(
            "--target-flag",
            help="a flag every compile and link of both builds gets with --target (repeatable; split like a shell "
            "line: --target-flag=-mcpu=cortex-m4 --target-flag='-isystem DIR')",
        ),
    ] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="the build trees, logs and reports")] = Path(
        "compare-build"
    ),
    build_system: Annotated[str, typer.Option(help="auto | cmake | meson | autotools | make")] = "auto",
    configure_arg: Annotated[
        list[str] | None,
        typer.Option(help="one more argument for the configure step (make: for make), both builds; repeatable"),
    ] = None,
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", help="parallel build jobs (default: all cores)")] = None,
    opt: Annotated[str, typer.Option(help="the optimization level of both builds")] = "-Oz",
    allow_fallback: Annotated[
        bool, typer.Option("--allow-fallback", help="let a compile optgym could not serve fall back to clang")
    ] = False,
) -> None:
    """Build a project twice — clang-22, then optgym-cc/optgym-c++, same flags — and compare its LINKED outputs.

    Writes OUTPUT/report.json and OUTPUT/report.md and prints the latter. The optgym build runs with the
    caller's OPTGYM_* settings and OPTGYM_STRICT=1. Exits 1 if a build fails or a test fails only in the
    optgym build."""
    from optgym.corpus.target import Target
    from optgym.evaluate.build_compare import CompareOptions, write_report
    from optgym.evaluate.build_compare import compare_build as run_compare

    try:
        chosen = Target.of(target, target_flag or ())
    except ValueError as e:
        _fail(str(e))
    options = CompareOptions(source=source, outdir=output, build_system=build_system, lto=lto, target=target,
                             target_flags=chosen.flags if chosen else (), opt=opt,
                             configure_args=tuple(configure_arg or ()), jobs=jobs or os.cpu_count() or 1, test=test,
                             allow_fallback=allow_fallback)  # fmt: skip
    try:
        report = run_compare(options, progress=lambda line: err.print(line, highlight=False, markup=False))
    except OptgymError as e:
        _fail(str(e))
    print(write_report(report, Path(report["outdir"])))
    for problem in report["problems"]:
        err.print(problem, style="bold red", highlight=False, markup=False)
    if report["problems"]:
        raise typer.Exit(1)


@app.command()
def demo(
    output: Annotated[Path, typer.Option("-o", "--output", help="where everything goes")] = Path("demo-out"),
    bundled: Annotated[
        bool,
        typer.Option("--bundled", help="the 30-second tour: four bundled programs, no Debian packages, no training"),
    ] = False,
    workers: Workers = None,
) -> None:
    """Learning on real code: Debian's demo packages → split → ES → evaluation on a package it never saw.

    The learner is ES over an allowance above clang's inline threshold (optgym.policies.allowance), started
    from clang's own decisions; the held-out package is C++, where inlining has something to win."""
    import shutil
    import subprocess
    import time

    from optgym.corpus.debian import DEMO_HELD_OUT, PRESETS
    from optgym.problems import problem_class
    from optgym.toolchain import find_toolchain

    toolchain = find_toolchain((problem_class("inline-size").hook,))
    console.print(f"[bold]compiler[/] {toolchain.banner} at {toolchain.clang}")
    if bundled:
        _bundled_demo(output)
        return
    jobs = ["-j", str(workers)] if workers else []
    corpus, es, report = (output / n for n in ("corpus", "es", "report"))
    gates = "default,cxx"  # the ladder, and the language: the training side has both
    steps = [
        (f"corpus: Debian packages {', '.join(PRESETS['demo'])} (built with clang-22 -Oz, bitcode embedded)",
         ["corpus", "debian", "--preset", "demo", "-o", str(corpus), *jobs]),
        (f"split: hold out {DEMO_HELD_OUT}", ["corpus", "split", str(corpus), "--test-groups", DEMO_HELD_OUT]),
        ("evolution strategies: an allowance over clang's inline threshold, learned from clang's own decisions",
         ["train", "es", "--corpus", str(corpus), "--split", "train", "--allowance", gates, "--iterations", "6",
          "--directions", "4", "--modules-per-iteration", "16", "--sigma", "0.1", "--learning-rate", "0.05",
          "--fitness", "total", "--loss-weight", "1", "--shaping", "rank", "--no-final-eval", "-o", str(es), *jobs]),
        (f"evaluation on the held-out package ({DEMO_HELD_OUT}), against clang's own -Oz",
         ["evaluate", "--policy", str(es), "--corpus", str(corpus), "--split", "test", "-o", str(report), *jobs]),
    ]  # fmt: skip
    start = time.monotonic()
    # a rerun trains again (the corpus is reused): the demo shows learning, and ES refuses to write over a run
    shutil.rmtree(es, ignore_errors=True)
    for title, args in steps:
        console.rule(f"[bold]{title}")
        console.print(f"$ optgym {' '.join(args)}", highlight=False, soft_wrap=True)
        t0 = time.monotonic()
        if subprocess.run([sys.executable, "-m", "optgym.cli", *args]).returncode != 0:
            _fail(f"demo step failed: optgym {' '.join(args)}")
        console.print(f"[dim]{time.monotonic() - t0:.0f} s[/]")
    console.rule("[bold]done")
    console.print(f"pipeline after installation: {time.monotonic() - start:.0f} s; report: {report / 'report.md'}")


def _bundled_demo(output: Path) -> None:
    from importlib.resources import files

    from optgym.corpus.embedded import corpus_from_sources
    from optgym.toolchain import find_toolchain

    sources = {
        Path(str(p)).stem: Path(str(p))
        for p in files("optgym.data.demo").iterdir()
        if Path(str(p)).suffix in (".c", ".cpp")
    }
    corpus_dir = output / "corpus"
    corpus_from_sources(find_toolchain(), dict(sorted(sources.items())), corpus_dir)
    console.print(f"[bold]corpus[/] {len(sources)} modules in {corpus_dir}")
    for policy in ("heuristic", "random", "never"):
        evaluate(
            corpus=corpus_dir, policy=policy, report=output / f"report-{policy}", split=None, problem="inline-size",
            workers=None, mode="eval", seed=0, timeout=120.0, transcript=None, json_out=False, all_snapshots=False,
        )  # fmt: skip


def main() -> None:
    app()


if __name__ == "__main__":
    main()
