#!/usr/bin/env python3
"""Ship a trained policy as optgym's ``pretrained`` one for its problem, with its provenance beside it.

    .venv/bin/python -m maintainer.ship_pretrained RUN --corpus CORPUS [--problem P] [--train-sample N]
        [--fresh CORPUS] [-j N]
    .venv/bin/python -m maintainer.ship_pretrained --unseen CORPUS [--unseen CORPUS]... [-j N]
    .venv/bin/python -m maintainer.ship_pretrained --scorers-alone CORPUS [-j N]
    .venv/bin/python -m maintainer.ship_pretrained --linked COMPARE_BUILD_DIR [--linked DIR]...
    .venv/bin/python -m maintainer.ship_pretrained RUN --corpus CORPUS --target aarch64 [-j N]
    .venv/bin/python -m maintainer.ship_pretrained --unseen CORPUS --target aarch64 [-j N]
    .venv/bin/python -m maintainer.ship_pretrained --problem P --languages FAMILY[,FAMILY]

1. The policy into ``src/optgym/policies/pretrained/`` — what ``--policy pretrained`` and
   ``optgym-cc``'s default load, exported as ONNX (``optgym export``): an inliner MLP to
   ``inline-size.onnx``, an eviction scorer (19 weights) to ``regalloc-evict.onnx``, a priority scorer
   (4) to ``regalloc-priority.onnx``, each scorer with the compiler it was trained with, deciding only the
   language it was trained on (``train es --language``);
2. the policy, as shipped, compiled on the held-out side of ``CORPUS``'s stored split (packages the
   run never saw), figures per language; for a register-allocation scorer also together with every
   policy shipped (what ``optgym-cc`` runs by default), and on ``--train-sample`` modules of the
   training side;
   With ``--fresh``, every shipped policy together on a corpus of packages outside the training list
   altogether (not even held out from it), per language: the figure no choice could have looked at;
3. ``<problem>.provenance.json`` beside it: the training packages and their exact Debian versions,
   the held-out ones, the command that reproduces the run, the compiler, the figures on the training
   side and on the held-out packages.

``--thinlto`` ships a register-allocation scorer as the policy of ThinLTO links' backends instead
(``<problem>-thinlto.onnx``, served by ``optgym_cc.thinlto``; ``CORPUS`` is then a ThinLTO corpus, ``optgym
corpus debian --thinlto``): its held-out figures alone, and together with the other ThinLTO scorer if one
ships; the per-object policies are left as they are.

``--unseen`` ships nothing: it measures every shipped policy together on each corpus of packages outside
the training list (as ``--fresh`` does) and writes the figures into every shipped provenance, under
``unseen_packages_with_shipped_policies`` (one entry per corpus, replacing an entry of the same name) —
sets of packages built after a policy shipped belong beside it too, and re-shipping would need the
training runs.

``--scorers-alone`` ships nothing either: on each corpus's C modules it measures each shipped allocator scorer
alone and the scorers together, with clang's inlining and no portfolio (no second compile can hide a loss), and
writes the figures, with each configuration's largest package, into each scorer's provenance under
``unseen_scorers_alone``.

``--target DIR`` ships an inliner for another target: into ``pretrained/DIR/`` (``aarch64``; ``thumbv7em``, ``arm``),
where ``optgym-cc`` looks first for a compile of that target (docs/targets.md), with its provenance beside it. Its
figures are the file's own, measured by its path (``--policy pretrained`` is x86-64's); with ``--unseen``, the target
inliner alone on each corpus, into its provenance.

``--linked`` ships nothing either: it records the linked figures of real builds, made with ``optgym compare-build
SRC --test`` and the shipped inliner served by default, under ``linked_builds`` in the inliner's provenance (one
entry per package, replacing one of the same package). Per-object sums count copies a linker folds, so these are
the figures a user's program shows; a cross build's (``--target``) go to that target's inliner. A report is refused
unless both builds passed their test suite, the build was without LTO (what the per-object inliner serves), it
served ``pretrained`` and its ``shipped_policies`` name the shipped inliner's very file, and the package is not
one the policy trained on.

``--languages`` ships nothing new: the shipped policy of ``--problem``, the same network, exported again to decide
only those language families, where its held-out figures show it deciding the others exactly as clang does (the
inline rule's C side is ``none``). A family it leaves to clang opens no channel in ``optgym-cc``: the same objects,
without a round trip per decision.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import itertools
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import optgym_cc
from optgym.corpus import Corpus
from optgym.files import atomic_write_bytes
from optgym.policies import PRETRAINED_NAMES, pretrained_path, pretrained_provenance
from optgym.policies.embedded import load_embedded
from optgym.policies.export import export_policy, run_provenance
from optgym.policies.portfolio import load_portfolio
from optgym.policies.scorer import CandidateScorer
from optgym.policies.trained import policy_dir_of
from optgym.train.evaluation import GUARD_BELOW, by_package, evaluate, summarize
from optgym.train.threshold import figures_by_language
from optgym_cc.thinlto import LTO_CHANNELS

#: Where ``--unseen`` keeps its figures in a provenance: one entry per corpus of packages outside the training list.
UNSEEN = "unseen_packages_with_shipped_policies"
#: Where ``--linked`` keeps its figures in the inliner's provenance: one entry per package built.
LINKED = "linked_builds"
#: Where ``--scorers-alone`` keeps its figures in each allocator scorer's provenance: one entry per corpus.
ALONE = "unseen_scorers_alone"
FIGURES = ("evaluated", "failed", "total_ratio", "dottext_ratio", "geomean_ratio", "improved", "regressed",
           "regressed_over_1pct", "heuristic_text_bytes", "policy_text_bytes", "guarded_ratio", "guarded_below_ratio",
           "guarded_below_over_1pct")  # fmt: skip


def by_language(rows: list, corpus: Corpus) -> dict[str, dict]:
    """The evaluation summary over all modules and per language (C++ includes ObjC++)."""
    return figures_by_language(rows, {r.module: corpus.module(r.module).family for r in rows}, FIGURES)


def training_figures(run: Path, metadata: dict) -> dict:
    """The run's own figures on its training side: its final metrics and, for a tuned run (``train
    threshold``), every candidate's figures on the tuning sample."""
    figures = dict(metadata["provenance"].get("metrics") or {})
    candidates = run / "candidates.json"
    if candidates.is_file():
        figures["candidates"] = json.loads(candidates.read_text())["candidates"]
    return figures


def ship_scorer(run: Path, destination: Path) -> dict:
    """Export ``run``'s candidate scorer to ``destination`` with the compiler it was trained with in its
    ``source`` (what the policy server checks before serving it) and the language it was trained on
    (the only one it decides); the export's metadata, with the run's provenance."""
    found = policy_dir_of(run)
    if found is None:
        sys.exit(f"{run} holds no trained policy")
    scorer = CandidateScorer.load(found)
    provenance = run_provenance(found)
    compiler = scorer.source.get("compiler") or (provenance.get("versions") or {}).get("clang")
    scorer.source = {**scorer.source, "compiler": compiler, "run": provenance.get("run"),
                     "snapshot": provenance.get("snapshot")}  # fmt: skip
    trained_on = (provenance.get("config") or {}).get("language")
    scorer.languages = [trained_on] if trained_on else None  # it decides the language it was trained on
    with tempfile.TemporaryDirectory(prefix="optgym-ship-") as tmp:
        return export_policy(scorer.save(Path(tmp) / "policy"), destination, provenance=provenance)


def ship_export(export: Path, destination: Path) -> dict:
    """A policy already exported (a ``.onnx`` file: one shipped for another use, say) shipped byte for byte,
    deciding the languages it decides there; the metadata it carries, with its run's provenance."""
    policy = load_embedded(export)
    if policy is None:
        sys.exit(f"{export} embeds no optgym policy")
    shutil.copyfile(export, destination)
    return policy.metadata


def sample(corpus: Corpus, count: int) -> list[str]:
    """Every ``len/count``-th module of ``corpus`` by name: a fixed sample, the same on every run."""
    names = sorted(m.name for m in corpus)
    step = max(1, len(names) // count) if count else 1
    return names[::step][:count] if count else names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "run",
        type=Path,
        nargs="?",
        help="the trained run (or policy directory) to ship, or an exported .onnx to ship as it is",
    )
    parser.add_argument("--corpus", type=Path, help="the corpus whose test side is held out")
    parser.add_argument("--problem", default="inline-size", choices=tuple(PRETRAINED_NAMES))
    parser.add_argument("--train-sample", type=int, default=0,
                        help="also evaluate this many training modules (0: the run's own figures only)")  # fmt: skip
    parser.add_argument("--fresh", type=Path, help="a corpus of packages outside the training list to measure on")
    unseen_help = "ship nothing: add the shipped policies' figures on this corpus to their provenances"
    parser.add_argument("--unseen", type=Path, action="append", default=[], help=unseen_help)
    alone_help = "ship nothing: each shipped allocator scorer alone, and together, on this corpus's C modules"
    parser.add_argument("--scorers-alone", type=Path, action="append", default=[], help=alone_help)
    parser.add_argument(
        "--thinlto",
        action="store_true",
        help="ship a scorer as the policy of ThinLTO links' backends (<problem>-thinlto.onnx)",
    )
    target_help = "ship an inliner for this target's compiles (a directory of pretrained/: aarch64, thumbv7em, arm)"
    parser.add_argument("--target", help=target_help)
    linked_help = "ship nothing: record this compare-build output's linked figures in the inliner's provenance"
    parser.add_argument("--linked", type=Path, action="append", default=[], help=linked_help)
    languages_help = "ship nothing new: the shipped policy decides only these families (C, C++), as clang elsewhere"
    parser.add_argument("--languages", help=languages_help)
    parser.add_argument("-j", "--workers", type=int, default=None)
    args = parser.parse_args()
    if args.languages:
        return restrict_languages(args.problem, args.languages.split(","))
    if args.thinlto and args.problem == "inline-size":
        parser.error("--thinlto ships a register-allocation scorer (--problem regalloc-evict|regalloc-priority)")
    if args.target and (args.problem != "inline-size" or args.thinlto or args.fresh or args.scorers_alone):
        parser.error("--target ships an inliner alone (no --problem, --thinlto, --fresh or --scorers-alone)")
    if args.target and args.unseen:
        return add_target_unseen(args.target, args.unseen, args.workers)
    if args.linked:
        if args.run is not None or args.unseen or args.scorers_alone:
            parser.error("--linked ships nothing and measures nothing: give it alone")
        measured = sorted((linked_figures(d) for d in args.linked), key=lambda e: str(e[0]))
        for provenance, entries in itertools.groupby(measured, lambda e: e[0]):  # x86-64's inliner, or a target's
            record([entry for _, entry in entries], LINKED, [provenance], by="package")
        return 0
    if args.unseen or args.scorers_alone:
        if args.run is not None:
            parser.error("--unseen and --scorers-alone ship nothing: give no RUN")
        if args.scorers_alone:
            add_scorers_alone(args.scorers_alone, args.workers)
        return add_unseen(args.unseen, args.workers) if args.unseen else 0
    if args.run is None or args.corpus is None:
        parser.error("RUN and --corpus are required to ship (or --unseen CORPUS to add figures)")

    shipped = thinlto_path(args.problem) if args.thinlto else pretrained_path(args.problem)
    if args.target:
        shipped = target_path(args.target)
        shipped.parent.mkdir(exist_ok=True)
    trained = export_policy if args.problem == "inline-size" else ship_scorer
    ship = ship_export if args.run.suffix == ".onnx" else trained
    metadata = ship(args.run, shipped)
    digest = hashlib.sha256(shipped.read_bytes()).hexdigest()
    print(f"shipped {args.run} → {shipped}")
    description = Corpus(args.corpus).description["optgym"]
    split = description.get("split")
    if not split:
        sys.exit(f"{args.corpus} has no stored split: the held-out packages are its test side")
    heldout_corpus = Corpus(args.corpus, split="test")
    spec = str(shipped) if args.thinlto or args.target else "pretrained"
    rows = evaluate(spec, heldout_corpus, problem=args.problem, workers=args.workers, progress=True)
    heldout = by_language(rows, heldout_corpus)
    figures = {"training": training_figures(args.run, metadata), "heldout": heldout}
    if args.train_sample:
        train_corpus = Corpus(args.corpus, split="train")
        train_rows = evaluate(spec, train_corpus, problem=args.problem, workers=args.workers,
                              modules=sample(train_corpus, args.train_sample), progress=True)  # fmt: skip
        figures["training_sample"] = by_language(train_rows, train_corpus)
    if args.thinlto:  # what a ThinLTO link's backends run by default: every ThinLTO scorer shipped
        other = [p for p in shipped_scorers() if p != args.problem and thinlto_path(p).is_file()]
        if other:
            together = evaluate(spec, heldout_corpus, problem=args.problem, workers=args.workers, progress=True,
                                companions=[(p, str(thinlto_path(p))) for p in other])  # fmt: skip
            figures["heldout_with_thinlto_policies"] = {"with": other, **by_language(together, heldout_corpus)}
    # what optgym-cc runs by default: every shipped policy of the compile
    beside = shipped_scorers()
    if args.problem != "inline-size" and not args.thinlto:  # (a target ships its inliner alone)
        together = evaluate("pretrained", heldout_corpus, workers=args.workers, progress=True,
                            companions=[(p, "pretrained") for p in beside])  # fmt: skip
        figures["heldout_with_shipped_policies"] = {"with": ["inline-size", *beside],
                                                    **by_language(together, heldout_corpus)}  # fmt: skip
    if args.fresh:
        figures["fresh_packages_with_shipped_policies"] = unseen_figures(args.fresh, beside, args.workers)
    packages = description.get("packages", {})
    test_groups = set(split["test_groups"])
    trained = training_packages(args.run, metadata, args.corpus)
    provenance = {
        "policy": shipped.relative_to(pretrained_path(args.problem).parent).as_posix(),
        "sha256": digest,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "problem": metadata["problem"],
        "compiler": metadata.get("compiler"),
        "algorithm": metadata["provenance"].get("algorithm"),
        "command": metadata["provenance"].get("command"),
        "run_config": metadata["provenance"].get("config"),
        "corpus": {"path": str(args.corpus.resolve()), "distribution": description.get("provenance", {}).get(
            "distribution"), "split": {k: split[k] for k in ("by", "test_groups", "train_modules", "test_modules")}},
        "training_packages": trained if trained is not None else {p: v.get("version") for p, v in
                                                                  sorted(packages.items()) if p not in test_groups},
        "heldout_packages": {p: v.get("version") for p, v in sorted(packages.items()) if p in test_groups},
        "figures": figures,
    }  # fmt: skip
    provenance_path = shipped.with_suffix(".provenance.json")
    atomic_write_bytes(provenance_path, json.dumps(provenance, indent=2).encode())
    for label, table in figures.items():
        print_figures(label, table)
    print(f"provenance → {provenance_path}")
    return 0


def restrict_languages(problem: str, families: list[str]) -> int:
    """Export the shipped policy of ``problem`` again, deciding only ``families``; refused unless its held-out
    figures show every other family compiled exactly as clang does (no module changed, the same bytes)."""
    if not families or set(families) - {"C", "C++"}:
        sys.exit(f"--languages takes C, C++ or both, not {families}")
    shipped = pretrained_path(problem)
    provenance_path = shipped.with_suffix(".provenance.json")
    provenance = json.loads(provenance_path.read_text())
    for family in sorted({"C", "C++"} - set(families)):
        held = provenance["figures"]["heldout"].get(family) or {}
        if (
            not held.get("evaluated")
            or held.get("improved")
            or held.get("regressed")
            or (held.get("policy_text_bytes") != held.get("heuristic_text_bytes"))
        ):
            sys.exit(f"{shipped.name} does not decide {family} as clang does on its held-out modules: not restricted")
    with tempfile.TemporaryDirectory(prefix="optgym-ship-") as tmp:
        policy_dir = Path(tmp) / "policy"
        embedded = load_embedded(shipped, into=policy_dir)  # read once: its metadata, and its directory unpacked
        if embedded is None:
            sys.exit(f"{shipped} embeds no optgym policy")
        meta = json.loads((policy_dir / "policy.json").read_text())
        (policy_dir / "policy.json").write_text(json.dumps(meta | {"languages": families}, indent=2))
        export_policy(policy_dir, shipped, provenance=embedded.metadata["provenance"])
    provenance["sha256"] = hashlib.sha256(shipped.read_bytes()).hexdigest()
    provenance["languages"] = {
        "decides": families,
        "command": f"python -m maintainer.ship_pretrained --problem {problem} --languages {','.join(families)}",
        "at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    atomic_write_bytes(provenance_path, json.dumps(provenance, indent=2).encode())
    print(f"{shipped.name} now decides {', '.join(families)} only; provenance → {provenance_path}")
    return 0


def add_unseen(corpora: list[Path], workers: int | None) -> int:
    """``--unseen``: every shipped policy together on each corpus, into every shipped provenance."""
    beside = shipped_scorers()
    measured = [unseen_figures(path, beside, workers) for path in corpora]
    for entry in measured:
        print_figures(f"unseen {entry['corpus']}", entry)
    return record(measured, UNSEEN, [pretrained_provenance(p) for p in ["inline-size", *beside]])


def target_path(target: str) -> Path:
    """Where the inliner for ``target``'s compiles ships: the first place ``optgym-cc`` looks for it."""
    return pretrained_path("inline-size").parent / target / pretrained_path("inline-size").name


def add_target_unseen(target: str, corpora: list[Path], workers: int | None) -> int:
    """``--unseen --target``: the target's inliner alone, by its path, on each corpus (of that target's code)."""
    shipped = target_path(target)
    if not shipped.is_file():
        sys.exit(f"no inliner ships for {target} ({shipped} is missing)")
    measured = []
    for path in corpora:
        corpus = Corpus(path)
        rows = evaluate(str(shipped), corpus, workers=workers, progress=True)
        measured.append({**set_record(path, corpus), "with": ["inline-size"], **by_language(rows, corpus)})
        print_figures(f"unseen {measured[-1]['corpus']}", measured[-1])
    return record(measured, UNSEEN, [shipped.with_suffix(".provenance.json")])


def linked_figures(outdir: Path) -> tuple[Path, dict]:
    """One ``optgym compare-build --test`` output as a ``linked_builds`` entry of the provenance of the inliner its
    build served (x86-64's, or its ``--target``'s), or a clear exit why it cannot be one (see the module doc):
    linked Berkeley text, ``.text`` and file bytes of both builds, and their tests."""
    path = outdir / "report.json"
    if not path.is_file():
        sys.exit(f"{outdir}: no report.json (the output directory of `optgym compare-build SRC --test -o DIR`)")
    report = json.loads(path.read_text())
    options = report.get("options", {})
    # the file optgym-cc served the build's compiles, looked up as it looks it up (this machine's, or --target's)
    target = optgym_cc.triple_target(options.get("target"))
    served_file = optgym_cc.shipped_policy(os.path.basename(optgym_cc.PRETRAINED), target)
    if served_file is None:
        sys.exit(f"{outdir}: not recorded: optgym ships no inliner for {target[0]}")
    provenance_path = Path(served_file).with_suffix(".provenance.json")
    provenance = json.loads(provenance_path.read_text())
    shipped_name = Path(os.path.relpath(served_file, optgym_cc.PRETRAINED_DIR)).as_posix()
    package = re.sub(r"-\d.*$", "", report["name"])  # Debian's `apt-get source` tree: NAME-VERSION
    tests = report.get("tests") or {}
    statuses = {v: (tests.get(v) or {}).get("status") for v in ("plain", "optgym")}
    served = report.get("optgym_environment", {}).get("OPTGYM_POLICY", "pretrained")
    refusals = [
        *(f"its report names a problem: {p}" for p in report.get("problems", [])),
        *([] if statuses == {"plain": "passed", "optgym": "passed"} else
          [f"a linked figure needs the test suite passing in both builds (plain {statuses['plain']}, "
           f"optgym {statuses['optgym']})"]),
        *([] if options.get("lto") is None else ["the inliner ships for builds without LTO (this one had --lto)"]),
        *([] if served == "pretrained" else [f"it served OPTGYM_POLICY={served}, not the shipped inliner"]),
        *([] if report.get("shipped_policies", {}).get(shipped_name) == provenance["sha256"] else
          [f"its build served another {shipped_name} than the one shipped now (or its report predates the record)"]),
        *([f"{package} is on the inliner's training list"] if package in provenance["training_packages"] else []),
    ]  # fmt: skip
    if refusals:
        sys.exit(f"{outdir}: not recorded: " + "; ".join(refusals))
    totals = report["totals"]
    return provenance_path, {
        "package": package,
        "source": report["name"],
        "target": options.get("target"),
        "measured": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "side": "heldout" if package in provenance["heldout_packages"] else "unseen",
        "build_system": report["build_system"],
        "outputs": totals["paired"],
        "plain": totals["plain"],
        "optgym": totals["optgym"],
        "tests": statuses,
        "build_cpu_ratio": report.get("build_ratio", {}).get("cpu"),
    }


def add_scorers_alone(corpora: list[Path], workers: int | None) -> int:
    """``--scorers-alone``: each shipped allocator scorer alone and the scorers together on each corpus's C modules,
    into each scorer's provenance (an entry of the same corpus is replaced)."""
    scorers = shipped_scorers()
    measured = [scorers_alone_figures(path, scorers, workers) for path in corpora]
    return record(measured, ALONE, [pretrained_provenance(p) for p in scorers])


def record(measured: list[dict], key: str, provenances: list[Path], by: str = "corpus") -> int:
    """``measured`` (one entry per corpus, or per whatever ``by`` names) into the figures under ``key`` of each of
    the ``provenances``, replacing an entry of the same name and keeping the others."""
    names = {entry[by] for entry in measured}
    for path in provenances:
        provenance = json.loads(path.read_text())
        kept = [e for e in provenance["figures"].get(key, []) if e.get(by) not in names]
        provenance["figures"][key] = kept + measured
        atomic_write_bytes(path, json.dumps(provenance, indent=2).encode())
        print(f"provenance → {path}")
    return 0


def scorers_alone_figures(path: Path, scorers: list[str], workers: int | None) -> dict:
    """``scorers`` each alone, then all together, on the C modules of ``path`` (the scorers decide C only), with
    clang's inlining and no portfolio; per configuration the figures and the package whose bytes grew most."""
    corpus = Corpus(path)
    modules = [m.name for m in corpus if m.family == "C"]
    if not modules:
        sys.exit(f"{path} has no C modules: the allocator scorers decide C only")
    configurations = {problem: (problem, []) for problem in scorers}
    configurations["together"] = (scorers[0], [(p, "pretrained") for p in scorers[1:]])
    entry: dict = {**set_record(path, corpus), "scorers": scorers}
    for label, (problem, companions) in configurations.items():
        rows = evaluate("pretrained", corpus, problem=problem, modules=modules, workers=workers, progress=True,
                        companions=companions)  # fmt: skip
        entry[label] = {**by_language(rows, corpus), "largest_package": largest_package(rows)}
        print_figures(f"{entry['corpus']}, {label}", entry[label])
    return entry


def largest_package(rows: list) -> dict:
    """The package whose Berkeley text grew most (its bytes over clang's), of the compiled modules in ``rows``."""
    # a package of empty objects has no ratio
    ratios = {name: summarize(group)["total_ratio"] for name, group in by_package(rows).items()}
    grown = {name: ratio for name, ratio in ratios.items() if ratio is not None}
    name = max(grown, key=grown.__getitem__)
    return {"package": name, "ratio": grown[name]}


def training_packages(run: Path, metadata: dict, corpus: Path) -> dict | None:
    """The packages a policy shipped as it is (an export) was trained on, when its run's corpus is not ``corpus``:
    what the provenance beside the export records (``{}`` if none is there). ``None``: it trained on ``corpus``,
    whose training side says."""
    trained_on = (metadata["provenance"].get("config") or {}).get("corpus")
    if run.suffix != ".onnx" or not trained_on or Path(trained_on).resolve() == corpus.resolve():
        return None
    recorded = run.with_suffix(".provenance.json")
    return json.loads(recorded.read_text()).get("training_packages", {}) if recorded.is_file() else {}


def thinlto_path(problem: str) -> Path:
    """Where the policy of ThinLTO links' backends for ``problem`` ships: the launcher's own table."""
    shipped = {name: file for name, _, file, _ in LTO_CHANNELS}
    return pretrained_path(problem).with_name(shipped[problem])


def shipped_scorers() -> list[str]:
    """The register-allocation scorers shipped beside the inliner: what ``optgym-cc`` serves by default."""
    return [p for p in PRETRAINED_NAMES if p != "inline-size" and pretrained_path(p).is_file()]


def unseen_figures(path: Path, beside: list[str], workers: int | None) -> dict:
    """Every shipped policy together (the inliner and ``beside``) on a corpus of packages outside the
    training list, per language, with the packages and their versions: C compiled as ``optgym-cc`` compiles it
    by default, by the shipped portfolio's first ``default_candidates`` candidates."""
    corpus = Corpus(path)
    count = load_portfolio().default_count  # optgym-cc's default
    rows = evaluate("pretrained", corpus, workers=workers, progress=True, candidates=count,
                    companions=[(p, "pretrained") for p in beside])  # fmt: skip
    return {
        **set_record(path, corpus),
        "with": ["inline-size", *beside],
        "candidates": count,  # of the shipped portfolio, for C (optgym-cc's OPTGYM_CANDIDATES)
        **by_language(rows, corpus),
    }


def set_record(path: Path, corpus: Corpus) -> dict:
    """What every entry of a set outside the training list starts with: its name, when it was measured, and its
    packages with their versions."""
    packages = corpus.description["optgym"].get("packages", {})
    return {
        "corpus": path.resolve().name,
        "measured": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "packages": {p: v.get("version") for p, v in sorted(packages.items())},
    }


def print_figures(label: str, table: object) -> None:
    """One line per language of a figures table (other entries of ``figures`` are skipped)."""
    for name in ("all", "C", "C++"):
        f = table.get(name) if isinstance(table, dict) else None
        if not isinstance(f, dict) or not f.get("evaluated"):
            continue
        print(
            f"{label} {name:3s}: {f['evaluated']} modules, Berkeley text {f['total_ratio']:.4f}, "
            f".text {f['dottext_ratio']:.4f}, {f['regressed_over_1pct']} > 1 % worse; "
            f"guarded (OPTGYM_GUARD=1) {f['guarded_ratio']:.4f}, "
            f"below {GUARD_BELOW} B {f['guarded_below_ratio']:.4f} ({f['guarded_below_over_1pct']} > 1 % worse)"
        )


if __name__ == "__main__":
    raise SystemExit(main())
