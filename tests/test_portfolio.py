"""The shipped portfolio for C: its file, its evaluation (the smallest of N compiles per module) and optgym-cc
compiling an object N ways with the real clang-22 — the default build's pass option included."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import C_SOURCE, _corpus
from typer.testing import CliRunner

from maintainer import portfolio as portfolio_tool
from optgym.cli import app
from optgym.policies import DEFAULT_GUARD_BELOW, PRETRAINED_DIR, pretrained_path
from optgym.policies.embedded import load_embedded
from optgym.policies.portfolio import (
    BUILTIN_SPECS,
    PASS_OPTIONS,
    PRETRAINED_PORTFOLIO,
    Candidate,
    PortfolioError,
    load_portfolio,
)
from optgym.toolchain import object_sizes
from optgym.train.evaluation import ModuleRow, evaluate, evaluate_portfolio

ROOT = Path(__file__).resolve().parents[1]

CC = str(Path(sys.executable).parent / "optgym-cc")
CLANG = "/usr/lib/llvm-22/bin/clang"

#: Register pressure (the allocator scorers' decisions), a six-case switch (a jump table at -Oz's four cases,
#: compare-and-branch from eight) and a two-way phi: candidates of the shipped portfolio differ on it.
PORTFOLIO_SOURCE = r"""
extern void use(long, long, long, long, long, long, long, long);
extern int out(int);
void pressure(long *a, int n) {
  long s0 = a[0], s1 = a[1], s2 = a[2], s3 = a[3], s4 = a[4], s5 = a[5], s6 = a[6], s7 = a[7];
  long s8 = a[8], s9 = a[9], s10 = a[10], s11 = a[11], s12 = a[12], s13 = a[13], s14 = a[14], s15 = a[15];
  for (int i = 0; i < n; i++) {
    s0 += s8 * i; s1 ^= s9 + i; s2 -= s10 | i; s3 += s11 ^ s0; s4 *= s12 + 1; s5 += s13 - s1;
    s6 ^= s14 * s2; s7 += s15 + s3; s8 -= s4; s9 += s5; s10 ^= s6; s11 += s7; s12 -= s0; s13 += s1;
    s14 ^= s2; s15 += s3;
    if (s0 & 1) use(s0, s1, s2, s3, s4, s5, s6, s7);
  }
  use(s8, s9, s10, s11, s12, s13, s14, s15);
}
int dispatch(int op, int x) {
  switch (op) {
  case 0: return out(x + 1);
  case 1: return out(x * 3);
  case 2: return out(x - 7);
  case 3: return out(x ^ 5);
  case 4: return out(x << 2);
  case 5: return out(x | 9);
  default: return 0;
  }
}
int pick(int c, int a, int b) { int r; if (c > 3) r = a + b; else r = a - b; return r * 2; }
"""


@pytest.fixture(scope="module")
def port_corpus(toolchain, tmp_path_factory):
    return _corpus(toolchain, tmp_path_factory.mktemp("portfolio"), {"port": (".c", PORTFOLIO_SOURCE)})


def write(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_the_shipped_portfolio_loads_and_starts_with_the_default_builds_compile():
    portfolio = load_portfolio()
    assert portfolio.family == "C" and len(portfolio.candidates) >= 7
    first = portfolio.candidates[0]
    # the default build's compile opens no channel (each costs a compile up to 1.4x): pass options alone
    assert first.policies == (("regalloc-evict", "heuristic"), ("regalloc-priority", "heuristic"))
    assert first.flags and first.flags[::2] == ("-mllvm",) * (len(first.flags) // 2)  # options of -Oz's passes
    assert portfolio.default_count == 1
    second = portfolio.candidates[1]  # the first more compile buys: the scorers it was chosen with, same options
    evict = str(PRETRAINED_DIR / "portfolio-c" / "regalloc-evict-2026-11-24.onnx")  # pinned: chosen with that one
    assert second.policies == (("regalloc-evict", evict), ("regalloc-priority", "pretrained"))
    assert second.flags == first.flags
    assert [c.name for c in portfolio.candidates if c.is_clang] == ["clang"] == [portfolio.candidates[2].name]
    assert portfolio.first(2) == portfolio.candidates[:2] and portfolio.first(99) == portfolio.candidates
    with pytest.raises(PortfolioError, match="at least one"):
        portfolio.first(0)
    shipped = {Path(spec) for c in portfolio.candidates for _, spec in c.policies if spec not in BUILTIN_SPECS}
    assert shipped and all(p.is_file() and p.parent.parent == PRETRAINED_DIR for p in shipped)


def test_the_chooser_puts_a_targets_own_scorers_in_every_entry(tmp_path):
    """``choose --scorers DIR``: the target's pair decides every pool entry in place of the shipped one, its
    perturbations are of that pair (not of the shipped scorers), and a DIR without the pair is a clear error."""
    scorers = tmp_path / "scorers"
    for problem in portfolio_tool.PERTURBATIONS:
        shipped = load_embedded(pretrained_path(problem))
        shifted = shipped.with_parameters(shipped.parameters() + 5.0)  # far from the shipped one
        shifted.save(scorers / problem)
    pair = portfolio_tool.target_scorers(scorers)
    entries = portfolio_tool.pool(tmp_path / "pool", size_passes=True, scorers=pair)
    assert entries["target scorers"] == (pair, ())
    assert all(policies == pair for name, (policies, flags) in entries.items() if flags)
    perturbed = {name: policies for name, (policies, flags) in entries.items() if not flags and policies != pair}
    assert len(perturbed) == 2 * portfolio_tool.VARIANTS
    for policies in perturbed.values():
        ((problem, path),) = [(p, s) for p, s in policies.items() if s != pair[p]]
        base = portfolio_tool.load_scorer(problem, pair[problem]).parameters()
        moved = portfolio_tool.load_scorer(problem, path).parameters()
        shipped = load_embedded(pretrained_path(problem)).parameters()
        assert np.abs(moved - base).mean() < np.abs(moved - shipped).mean()
    with pytest.raises(SystemExit, match=r"neither a policy directory regalloc-evict nor regalloc-evict\.onnx"):
        portfolio_tool.target_scorers(tmp_path / "empty")


def test_the_chooser_takes_a_shipped_targets_exported_pair(tmp_path):
    """``choose --scorers DIR`` with ``DIR/regalloc-*.onnx`` (a shipped target portfolio's ``portfolio-c/``): the
    exported pair decides every entry of pass options, and its perturbations move from that pair."""
    exported = tmp_path / "portfolio-c"
    for problem in portfolio_tool.PERTURBATIONS:
        shipped = load_embedded(pretrained_path(problem))
        trained = shipped.with_parameters(shipped.parameters() + 5.0).save(tmp_path / "runs" / problem)
        portfolio_tool.export_policy(trained, exported / f"{problem}.onnx")
    pair = portfolio_tool.target_scorers(exported)
    assert pair == {p: str((exported / f"{p}.onnx").absolute()) for p in portfolio_tool.PERTURBATIONS}
    entries = portfolio_tool.pool(tmp_path / "pool", scorers=pair)
    assert all(policies == pair for name, (policies, flags) in entries.items() if flags)
    base = portfolio_tool.load_scorer("regalloc-evict", pair["regalloc-evict"]).parameters()
    moved = [p["regalloc-evict"] for p, flags in entries.values() if p["regalloc-evict"] != pair["regalloc-evict"]]
    assert len(moved) == portfolio_tool.VARIANTS
    for path in moved:
        assert 0 < np.abs(portfolio_tool.load_scorer("regalloc-evict", path).parameters() - base).mean() < 5


def test_a_portfolio_applies_to_a_build_that_leaves_its_problems_at_the_default(tmp_path):
    """A build takes the portfolio where every problem its first candidate decides is the shipped policy's or not
    named at all (a target's build names only what the target ships: its portfolio brings its own scorers), and not
    where the build chose another policy for one of them."""
    scorer = tmp_path / "evict.onnx"
    scorer.write_bytes(pretrained_path("regalloc-evict").read_bytes())
    candidates = [{"name": "scorers", "policies": {"regalloc-evict": str(scorer)}}, {"name": "clang"}]
    data = {"format": "optgym-portfolio/1", "family": "C", "candidates": candidates}
    portfolio = load_portfolio(write(tmp_path / "p.json", data))
    assert portfolio.applies_to([("inline-size", "heuristic")])
    assert portfolio.applies_to([("inline-size", "pretrained"), ("regalloc-evict", "pretrained")])
    assert not portfolio.applies_to([("inline-size", "heuristic"), ("regalloc-evict", "heuristic")])
    assert not portfolio.applies_to([("regalloc-evict", str(scorer))])


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (None, "unreadable"),
        ({"format": "optgym-portfolio/0", "family": "C", "candidates": [{"name": "clang"}]}, "not an"),
        ({"format": "optgym-portfolio/1", "family": "Rust", "candidates": [{"name": "clang"}]}, "family"),
        ({"format": "optgym-portfolio/1", "family": "C", "candidates": []}, "non-empty"),
        ({"format": "optgym-portfolio/1", "family": "C", "candidates": [{"flags": []}]}, "malformed candidate"),
        ({"format": "optgym-portfolio/1", "family": "C", "candidates": [{"name": "a", "flags": [3]}]}, "strings"),
        ({"format": "optgym-portfolio/1", "family": "C", "candidates": [{"name": "a"}, {"name": "a"}]}, "repeat"),
        (
            {"format": "optgym-portfolio/1", "family": "C",
             "candidates": [{"name": "a", "policies": {"regalloc-evict": "gone.onnx"}}]},
            "gone.onnx is missing",
        ),
        ({"format": "optgym-portfolio/1", "family": "C", "candidates": [{"name": "clang"}], "default_candidates": 2},
         "default_candidates"),
        ({"format": "optgym-portfolio/1", "family": "C", "candidates": [{"name": "clang"}], "default_candidates": "1"},
         "default_candidates"),
        ({"format": "optgym-portfolio/1", "family": "C", "candidates": [{"name": "clang"}], "default_candidates": 0},
         "default_candidates"),
    ],
)  # fmt: skip
def test_a_broken_portfolio_file_is_a_clear_error_naming_it(tmp_path, data, message):
    path = tmp_path / "p.json"
    if data is not None:
        write(path, data)
    with pytest.raises(PortfolioError, match=message) as error:
        load_portfolio(path)
    assert str(path) in str(error.value)


def test_a_candidate_clashes_with_a_build_that_sets_the_same_llvm_option():
    jt8 = Candidate("jt8", (), ("-mllvm", "-min-jump-table-entries=8"))
    assert jt8.clashes_with(["-Oz", "-mllvm", "-min-jump-table-entries=4", "-c", "x.c"])
    assert jt8.clashes_with(["-Oz", "-mllvm=-min-jump-table-entries=2"])
    assert not jt8.clashes_with(["-Oz", "-mllvm", "-enable-shrink-wrap=false", "-c", "x.c"])
    assert not Candidate("clang", ()).clashes_with(["-mllvm", "-min-jump-table-entries=4"])


def test_evaluate_keeps_each_modules_smallest_candidate(port_corpus, tmp_path):
    """Every candidate evaluated on its own, then the portfolio: each row is the smallest of the first N
    candidates' objects (clang's among them from N = 2), named in ``detail``; N = 1 is the default build's
    compile, the first candidate's pass options alone."""
    portfolio, names = load_portfolio(), ["port"]
    alone = {}
    for candidate in portfolio.candidates:
        if candidate.is_clang:
            continue
        (problem, spec), *companions = candidate.channel_policies([]) or [("inline-size", "heuristic")]
        (row,) = evaluate(spec, port_corpus, problem=problem, modules=names, workers=1, progress=False,
                          companions=companions, flags=candidate.flags)  # fmt: skip
        assert row.ok, row.detail
        alone[candidate.name] = row.policy_text
    (no_flags,) = evaluate("pretrained", port_corpus, problem="regalloc-evict", modules=names, workers=1,
                           progress=False, companions=[("regalloc-priority", "pretrained")])  # fmt: skip
    alone["clang"] = no_flags.heuristic_text
    assert len(set(alone.values())) > 2, f"the candidates should differ on this source: {alone}"
    for count in range(1, len(portfolio.candidates) + 1):
        (row,) = evaluate_portfolio(port_corpus, portfolio, count, names, workers=1, progress=False)
        chosen = [c.name for c in portfolio.first(count)]
        assert row.ok and row.policy_text == min(alone[name] for name in chosen), count
        assert row.detail in chosen and alone[row.detail] == row.policy_text
    report, every = tmp_path / "r", str(len(portfolio.candidates))
    result = CliRunner().invoke(app, ["evaluate", "--corpus", str(port_corpus.root), "--policy", "pretrained",
                                      "--candidates", every, "--json", "-o", str(report)])  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads((report / "report.json").read_text())
    assert summary["policy_text_bytes"] == min(alone.values())
    assert summary["candidates"]["count"] == len(portfolio.candidates)
    bad = CliRunner().invoke(app, ["evaluate", "--corpus", str(port_corpus.root), "--candidates", "-1",
                                   "-o", str(tmp_path / "bad")])  # fmt: skip
    assert bad.exit_code == 1 and "at least one" in bad.output
    # naming the portfolio's own policies changes nothing; another eviction policy is not this portfolio's build
    base = ["evaluate", "--corpus", str(port_corpus.root), "--policy", "pretrained", "--candidates", every]
    same = CliRunner().invoke(app, [*base, "--with", "regalloc-evict=pretrained", "-o", str(tmp_path / "same")])
    assert same.exit_code == 0, same.output
    assert json.loads((tmp_path / "same" / "report.json").read_text())["policy_text_bytes"] == min(alone.values())
    other = str(PRETRAINED_DIR / "regalloc-evict.onnx")
    mixed = CliRunner().invoke(app, [*base, "--with", f"regalloc-evict={other}", "-o", str(tmp_path / "mixed")])
    assert mixed.exit_code == 1 and "with the shipped policy (pretrained) for regalloc-evict" in mixed.output


def test_a_default_c_compile_under_an_inliner_that_leaves_c_to_clang_keeps_the_pass_options(port_corpus):
    """The shipped inliner decides C++ only, so optgym-cc opens no channel for C and its launcher compiles the
    portfolio's first candidate as clang with its pass options. ``optgym evaluate --candidates 1`` must measure that
    compile, not clang's plain one (it did, from 2026-11-29 to 2026-12-07, and recorded C as 1.0000)."""
    inliner = load_embedded(pretrained_path("inline-size"))
    assert inliner is not None and inliner.languages == ["C++"], "this test needs an inliner that leaves C to clang"
    first = load_portfolio().candidates[0]
    assert not first.channel_policies([]), "the first candidate should be pass options alone"
    (flagged,) = evaluate("heuristic", port_corpus, modules=["port"], workers=1, progress=False, flags=first.flags)
    assert flagged.ok and flagged.policy_text != flagged.heuristic_text, "the options should move this source"
    (row,) = evaluate("pretrained", port_corpus, modules=["port"], workers=1, progress=False, candidates=1)
    assert row.ok and row.policy_text == flagged.policy_text


def run_cc(args, cwd, **env):
    full = {**os.environ, "OPTGYM_SERVER_IDLE": "5", **env}
    for name in ("OPTGYM_CANDIDATES", "OPTGYM_EVICT_POLICY", "OPTGYM_PRIORITY_POLICY", "OPTGYM_GUARD_BELOW"):
        if name not in env:
            full.pop(name, None)
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300, env=full)


def test_optgym_cc_compiles_the_portfolios_candidates_and_keeps_the_smallest(port_corpus, tmp_path):
    """The default build (no OPTGYM_CANDIDATES) compiles C with the portfolio's first candidate alone: clang
    with its pass options, no channel, byte for byte (and, under the default guard's bound, clang's own object
    where that is smaller), as evaluate says. With ``OPTGYM_CANDIDATES=7`` the object is exactly the smallest
    of the seven, and nothing is left beside it; a build that sets the first candidate's option itself keeps
    its own (no option given twice)."""
    portfolio = load_portfolio()
    (tmp_path / "port.c").write_text(PORTFOLIO_SOURCE)
    rows = {count: evaluate_portfolio(port_corpus, portfolio, count, ["port"], workers=1, progress=False)[0]
            for count in (1, 2, 7)}  # fmt: skip
    default = run_cc([CC, "-Oz", "-c", "port.c", "-o", "default.o"], tmp_path, OPTGYM_STRICT="1")
    assert default.returncode == 0, default.stderr
    clang_text, first_text = rows[1].texts
    guarded = DEFAULT_GUARD_BELOW is not None and first_text < DEFAULT_GUARD_BELOW
    assert object_sizes(tmp_path / "default.o").text_bytes == (min(first_text, clang_text) if guarded else first_text)
    options = [CLANG, "-Oz", *portfolio.candidates[0].flags, "-c", "port.c", "-o", "options.o"]
    subprocess.run(options, cwd=tmp_path, check=True)
    alone = run_cc([CC, "-Oz", "-c", "port.c", "-o", "alone.o"], tmp_path, OPTGYM_STRICT="1", OPTGYM_GUARD_BELOW="0")
    assert alone.returncode == 0, alone.stderr
    assert (tmp_path / "alone.o").read_bytes() == (tmp_path / "options.o").read_bytes()
    (tmp_path / "options.o").unlink(), (tmp_path / "alone.o").unlink()
    seven = run_cc([CC, "-Oz", "-c", "port.c", "-o", "seven.o"], tmp_path, OPTGYM_STRICT="1", OPTGYM_CANDIDATES="7")
    assert seven.returncode == 0, seven.stderr
    assert object_sizes(tmp_path / "seven.o").text_bytes == rows[7].policy_text
    one = run_cc([CC, "-Oz", "-c", "port.c", "-o", "one.o"], tmp_path, OPTGYM_STRICT="1", OPTGYM_GUARD_BELOW="0",
                 OPTGYM_CANDIDATES="1")  # fmt: skip
    assert one.returncode == 0, one.stderr
    assert object_sizes(tmp_path / "one.o").text_bytes == rows[1].policy_text
    own = ["-Oz", *portfolio.candidates[0].flags, "-c", "port.c"]  # clang refuses most options given twice
    clash = run_cc([CC, *own, "-o", "own.o"], tmp_path, OPTGYM_STRICT="1", OPTGYM_CANDIDATES="7")
    assert clash.returncode == 0, clash.stderr
    assert object_sizes(tmp_path / "own.o").text_bytes >= rows[7].policy_text
    bad = run_cc([CC, "-Oz", "-c", "port.c", "-o", "bad.o"], tmp_path, OPTGYM_CANDIDATES="all")
    assert bad.returncode == 0 and "OPTGYM_CANDIDATES='all' is not a number of compiles" in bad.stderr
    plain = subprocess.run([CLANG, "-Oz", "-c", "port.c", "-o", "plain.o"], cwd=tmp_path, check=True)
    assert plain.returncode == 0 and (tmp_path / "bad.o").read_bytes() == (tmp_path / "plain.o").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["port.c", "default.o", "seven.o", "one.o", "own.o", "bad.o", "plain.o"]
    )


def test_other_policies_or_candidates_zero_compile_without_the_portfolio(port_corpus, tmp_path):
    """The portfolio belongs to the shipped policies: a build that names its own eviction policy, or says
    ``OPTGYM_CANDIDATES=0``, gets no threshold added — the object a rollout of the policies alone gives."""
    (tmp_path / "port.c").write_text(PORTFOLIO_SOURCE)
    (alone,) = evaluate("pretrained", port_corpus, problem="regalloc-evict", modules=["port"], workers=1,
                        progress=False, companions=[("regalloc-priority", "pretrained")])  # fmt: skip
    zero = run_cc([CC, "-Oz", "-c", "port.c", "-o", "zero.o"], tmp_path, OPTGYM_STRICT="1", OPTGYM_CANDIDATES="0",
                  OPTGYM_GUARD_BELOW="0")  # fmt: skip
    assert zero.returncode == 0, zero.stderr
    assert object_sizes(tmp_path / "zero.o").text_bytes == alone.policy_text
    named = run_cc([CC, "-Oz", "-c", "port.c", "-o", "named.o"], tmp_path, OPTGYM_STRICT="1", OPTGYM_GUARD_BELOW="0",
                   OPTGYM_EVICT_POLICY=str(PRETRAINED_DIR / "regalloc-evict.onnx"), OPTGYM_CANDIDATES="7")  # fmt: skip
    assert named.returncode == 0, named.stderr
    assert object_sizes(tmp_path / "named.o").text_bytes == alone.policy_text
    assert PRETRAINED_PORTFOLIO.is_file()


def test_a_later_candidate_wins_and_a_failing_one_is_passed_over(port_corpus, tmp_path):
    """``OPTGYM_PORTFOLIO``: a portfolio whose first candidate (the shipped scorers without the threshold) is
    beaten by its third (with it), the second failing in clang (an option clang does not know): optgym-cc
    keeps the third's object — exactly what ``evaluate --portfolio`` reports — and only the first's when asked
    for two compiles; the failed compile leaves no file, and the build never sees its error. Unasked, the build
    compiles as many candidates as the file's ``default_candidates`` says."""
    shipped = {"regalloc-evict": "pretrained", "regalloc-priority": "pretrained"}
    portfolio_file = write(tmp_path / "mine.json", {"format": "optgym-portfolio/1", "family": "C", "candidates": [
        {"name": "shipped", "policies": shipped},
        {"name": "broken", "policies": shipped, "flags": ["-mllvm", "-no-such-option-in-clang=1"]},
        {"name": "jt8", "policies": shipped, "flags": ["-mllvm", "-min-jump-table-entries=8"]},
    ], "default_candidates": 3})  # fmt: skip
    portfolio = load_portfolio(portfolio_file)
    rows = {n: evaluate_portfolio(port_corpus, portfolio, n, ["port"], workers=1, progress=False)[0] for n in (2, 3)}
    assert rows[3].detail == "jt8" and rows[3].policy_text < rows[2].policy_text and rows[2].detail == "shipped"
    build = tmp_path / "build"
    build.mkdir()
    (build / "port.c").write_text(PORTFOLIO_SOURCE)
    env = {"OPTGYM_STRICT": "1", "OPTGYM_GUARD_BELOW": "0", "OPTGYM_PORTFOLIO": str(portfolio_file)}
    for n in (2, 3):
        out = run_cc([CC, "-Oz", "-c", "port.c", "-o", f"{n}.o"], build, OPTGYM_CANDIDATES=str(n), **env)
        assert out.returncode == 0 and out.stderr == "", out.stderr
        assert object_sizes(build / f"{n}.o").text_bytes == rows[n].policy_text, n
    unset = run_cc([CC, "-Oz", "-c", "port.c", "-o", "d.o"], build, **env)  # the file's default_candidates: 3
    assert unset.returncode == 0 and (build / "d.o").read_bytes() == (build / "3.o").read_bytes(), unset.stderr
    assert sorted(p.name for p in build.iterdir()) == ["2.o", "3.o", "d.o", "port.c"]
    report = tmp_path / "r"
    args = ["--candidates", "3", "--portfolio", str(portfolio_file), "-o", str(report)]
    result = CliRunner().invoke(app, ["evaluate", "--corpus", str(port_corpus.root), "--policy", "pretrained", *args])
    assert result.exit_code == 0, result.output
    assert json.loads((report / "report.json").read_text())["policy_text_bytes"] == rows[3].policy_text
    write(tmp_path / "broken.json", {"format": "optgym-portfolio/1"})
    broken = run_cc([CC, "-Oz", "-c", "port.c", "-o", "b.o"], build, OPTGYM_PORTFOLIO=str(tmp_path / "broken.json"))
    assert broken.returncode == 0 and "broken.json" in broken.stderr and "OPTGYM_CANDIDATES=0" in broken.stderr


def test_a_launcher_gone_stops_the_candidates_and_kills_the_running_compile(tmp_path):
    """The build was interrupted: no other candidate starts and the object is left as it is, with nothing
    beside it; the compile running at that moment (here a stand-in that would run 30 s) is killed and reaped."""
    from optgym.serve.server import Server, _Running
    from optgym.toolchain.process import spawn

    (tmp_path / "port.c").write_text(PORTFOLIO_SOURCE)
    argv = [CLANG, "-Oz", "-c", "port.c", "-o", "port.o"]
    subprocess.run(argv, cwd=tmp_path, check=True)
    before = (tmp_path / "port.o").read_bytes()
    server = Server("pretrained", "regalloc-evict", [("regalloc-priority", "pretrained")])
    candidates = load_portfolio().candidates
    build = [(s.problem.name, s.spec) for s in server.served]
    reply = server._other_candidates(argv, str(tmp_path), dict(os.environ), "c", build, candidates, 60,
                                     _Running(gone=True))  # fmt: skip
    assert reply == {"candidate": candidates[0].name}
    assert (tmp_path / "port.o").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["port.c", "port.o"]
    running = _Running(spawn(["sleep", "30"]))
    running.kill()
    assert running.compile.returncode is not None


def test_maintainer_portfolio_measure_records_every_prefix_in_the_portfolio_file(port_corpus, tmp_path):
    """``python -m maintainer.portfolio measure --record``: one entry per corpus in the file, every prefix's total —
    never larger as candidates are added, the last one what ``evaluate_portfolio`` keeps — and the file still loads."""
    mine = tmp_path / "portfolio-c.json"
    data = json.loads(PRETRAINED_PORTFOLIO.read_text())
    for candidate in data["candidates"]:  # the copy names the shipped scorer files by absolute path
        candidate["policies"] = {p: s if s in BUILTIN_SPECS else str(PRETRAINED_DIR / s)
                                 for p, s in candidate.get("policies", {}).items()}  # fmt: skip
    data.pop("measured", None)
    write(mine, data)
    for _ in range(2):  # measured again: the entry is replaced
        out = subprocess.run([sys.executable, "-m", "maintainer.portfolio", "measure", str(port_corpus.root),
                              "--portfolio", str(mine), "--record", "-j", "1"],
                             capture_output=True, text=True, timeout=600, cwd=ROOT)  # fmt: skip
        assert out.returncode == 0, out.stderr
    recorded = json.loads(mine.read_text())["measured"]
    (entry,) = recorded.values()
    totals = [p["total_ratio"] for p in entry["prefixes"]]
    count = len(data["candidates"])
    assert [p["compiles"] for p in entry["prefixes"]] == list(range(1, count + 1)) and entry["packages"] == ["port"]
    assert all(b <= a for a, b in itertools.pairwise(totals))
    bounds = entry["prefixes"][0]["guard_bounds"]  # one compile, guarded below larger bounds: never larger, dearer
    assert list(bounds) == ["4096", "8192", "16384"] and bounds["4096"]["total_ratio"] <= totals[0]
    assert all(0 <= b["second_compile"] <= 1 for b in bounds.values())
    for small, large in itertools.pairwise(bounds.values()):
        assert large["total_ratio"] <= small["total_ratio"] and large["second_compile"] >= small["second_compile"]
    (row,) = evaluate_portfolio(port_corpus, load_portfolio(mine), count, ["port"], workers=1, progress=False)
    assert totals[-1] == row.policy_text / row.heuristic_text


def test_a_candidate_whose_policy_does_not_load_is_passed_over(port_corpus, tmp_path):
    """A portfolio naming a damaged scorer file: that candidate's compile never starts, the build's own object
    stands (the shipped scorers', byte for byte what ``OPTGYM_CANDIDATES=1`` makes), with nothing on stderr."""
    (tmp_path / "damaged.onnx").write_bytes(b"\x08\x07not a model")
    shipped = {"regalloc-evict": "pretrained", "regalloc-priority": "pretrained"}
    portfolio_file = write(tmp_path / "mine.json", {"format": "optgym-portfolio/1", "family": "C", "candidates": [
        {"name": "shipped", "policies": shipped},
        {"name": "damaged", "policies": {**shipped, "regalloc-evict": "damaged.onnx"}},
    ]})  # fmt: skip
    (tmp_path / "port.c").write_text(PORTFOLIO_SOURCE)
    env = {"OPTGYM_STRICT": "1", "OPTGYM_GUARD_BELOW": "0", "OPTGYM_PORTFOLIO": str(portfolio_file)}
    for n in ("1", "2"):
        out = run_cc([CC, "-Oz", "-c", "port.c", "-o", f"{n}.o"], tmp_path, OPTGYM_CANDIDATES=n, **env)
        assert out.returncode == 0 and out.stderr == "", out.stderr
    assert (tmp_path / "2.o").read_bytes() == (tmp_path / "1.o").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1.o", "2.o", "damaged.onnx", "mine.json", "port.c"]


def _row(module: str, text: int | None, data: int = 0, clang: tuple[int, int] = (1000, 0)) -> ModuleRow:
    """A made-up module's row for the chooser's rules: ``text`` and ``data`` bytes (``None``: it failed) against
    clang's ``(text, data)``."""
    ok = text is not None
    return ModuleRow(module, clang[0], text, None, None, None, text / clang[0] if ok else None, 0, 0, 0.0,
                     "ok" if ok else "failed", heuristic_data=clang[1], policy_data=data if ok else None)  # fmt: skip


def test_choose_combine_adds_options_greedily_while_they_save_enough():
    """``python -m maintainer.portfolio choose --combine``'s rule on a made-up sample (the rule itself, not the
    compiles): each option saves its own bytes in one compile with the others; the greedy takes the largest saver first,
    passes over a combination that fails on a module, and stops at the first addition that saves less than
    ``MIN_GAIN``; every combination tried that compiled stays a pool entry for the rest of the choice."""
    tool = portfolio_tool
    saving = {"-a": 30, "-b": 20, "-c": 0.5, "-broken": 50}  # bytes per module, of 1000 per module in all
    modules = [f"m{i}" for i in range(4)]

    def compile_sample(policies, flags):
        rows = {}
        for m in modules:
            ok = not {"-first", "-broken"} <= set(flags) or m != "m3"  # fine alone, fails with the first's option
            text = 1000 - sum(saving[f] for f in flags if f in saving)
            rows[m] = _row(m, text if ok else None)
        return rows

    shipped = {"regalloc-evict": "pretrained"}
    entries = {"shipped scorers, first": (shipped, ("-first",))}
    entries |= {f"shipped scorers, {f}": (shipped, (f,)) for f in saving}
    entries["perturbed"] = ({"regalloc-evict": "x.onnx"}, ())  # not an option: other policies
    table = {name: compile_sample(*entry) for name, entry in entries.items()}
    log: list[dict] = []
    name = tool.combine("shipped scorers, first", entries, table, modules, 4000, 4, log, compile_sample)
    assert name == "shipped scorers, first + -a + -b"
    assert entries[name] == (shipped, ("-first", "-a", "-b"))
    assert all(row.policy_text == 950 for row in table[name].values())
    assert "shipped scorers, first + -broken" not in entries and any(e["alone"] is None for e in log)
    assert "shipped scorers, first + -a + -b + -c" in entries  # tried, saved too little, still an entry
    assert not any("perturbed" in e["combination"] for e in log)


def test_choose_counts_bytes_an_option_moves_into_data():
    """Global merge of constants can move read-only bytes into ``.data.rel.ro``: Berkeley text falls, the object does
    not shrink. The chooser sizes every entry by text + data, so such an option is neither a saving in a
    combination nor a way to pass the regression cap."""
    moved = {m: _row(m, 950, data=70) for m in ("m0", "m1")}  # 50 B out of text, 70 B into data
    assert portfolio_tool.worse_share(moved, {"m0": 1000, "m1": 1000}) == 1.0
    saving = {"-a": (30, 0), "-merge": (50, 70)}

    def compile_sample(policies, flags):
        return {m: _row(m, 1000 - sum(saving[f][0] for f in flags if f in saving),
                        data=sum(saving[f][1] for f in flags if f in saving)) for m in ("m0", "m1")}  # fmt: skip

    shipped = {"regalloc-evict": "pretrained"}
    entries = {"first": (shipped, ("-first",))} | {f"shipped scorers, {f}": (shipped, (f,)) for f in saving}
    table = {name: compile_sample(*entry) for name, entry in entries.items()}
    name = portfolio_tool.combine("first", entries, table, ["m0", "m1"], 2000, 2, [], compile_sample)
    assert name == "first + -a"


def test_the_smaller_object_is_smaller_in_text_and_data(toolchain, tmp_path):
    """``keep_smaller``, what optgym-cc keeps of two compiles of one object: a compile whose table moved from
    ``.rodata`` (text) into ``.data`` is smaller in Berkeley text and larger in the file, and loses."""
    from optgym.serve.guard import keep_smaller

    values = ", ".join(str(i * 7 + 1) for i in range(100))
    sources = {"rodata": f"const int t[100] = {{{values}}};", "data": f"int t[110] = {{{values}}};"}
    objects = {}
    for name, table in sources.items():
        (tmp_path / f"{name}.c").write_text(f"{table}\nint get(int i) {{ return t[i]; }}\n")
        objects[name] = tmp_path / f"{name}.o"
        subprocess.run([toolchain.clang, "-Oz", "-c", tmp_path / f"{name}.c", "-o", objects[name]], check=True)
    rodata, data = (object_sizes(objects[n]) for n in ("rodata", "data"))
    assert data.text_bytes < rodata.text_bytes and data.image_bytes > rodata.image_bytes
    before = objects["rodata"].read_bytes()
    assert keep_smaller(str(objects["rodata"]), str(objects["data"])) == (rodata.image_bytes, data.image_bytes)
    assert objects["rodata"].read_bytes() == before  # the build's own object stands
    assert keep_smaller(str(objects["data"]), str(objects["rodata"])) == (data.image_bytes, rodata.image_bytes)
    assert objects["data"].read_bytes() == before  # replaced by the smaller one


def test_choose_max_worse_keeps_regressing_entries_out_of_the_first_candidate():
    """``--max-worse``: the share of modules > 1 % worse is counted against clang's bytes, and a combination the cap
    refuses is passed over however much it saves."""
    rows = {m: _row(m, t) for m, t in {"a": 1011, "b": 1010, "c": 900, "d": 1000}.items()}
    assert portfolio_tool.worse_share(rows, dict.fromkeys("abcd", 1000)) == 0.25  # only a: 1 % is not worse
    modules = ["m0", "m1"]

    def compile_sample(policies, flags):
        return {m: _row(m, 1000 - 40 * ("-a" in flags) - 20 * ("-b" in flags))
                for m in modules}  # fmt: skip

    shipped = {"regalloc-evict": "pretrained"}
    entries = {"s, first": (shipped, ("-first",)), "s, -a": (shipped, ("-a",)), "s, -b": (shipped, ("-b",))}
    table = {name: compile_sample(*entry) for name, entry in entries.items()}
    name = portfolio_tool.combine("s, first", entries, table, modules, 2000, 2, [], compile_sample,
                                  allowed=lambda n: "-a" not in n)  # fmt: skip
    assert name == "s, first + s, -b"


def test_a_pool_with_clangs_allocator_holds_pass_options_only(tmp_path):
    """``choose --allocator clang`` (a target with no scorers of its own): every entry names no policy (clang's
    allocator, and a portfolio a target without scorers can serve), the first is clang's own compile, none is a
    perturbed scorer — and names shorten as the shipped pool's do. ``--size-passes`` adds its passes."""
    entries = portfolio_tool.pool(tmp_path, wide=False, allocator="clang")
    first, *options = entries
    assert entries[first] == ({}, ())
    assert len(options) == len(PASS_OPTIONS) and all(flags for _, flags in (entries[n] for n in options))
    assert all(p == entries[first][0] for p, _ in entries.values()) and not any(tmp_path.iterdir())
    assert [portfolio_tool._short(n) for n in options] == list(PASS_OPTIONS)
    shipped = portfolio_tool.pool(tmp_path / "shipped")
    assert len(shipped) > len(PASS_OPTIONS) + 1  # the shipped pool perturbs its scorers too
    wider = portfolio_tool.pool(tmp_path, allocator="clang", size_passes=True)
    assert [portfolio_tool._short(n) for n in wider][len(entries) :] == list(portfolio_tool.SIZE_PASSES)


WIDE_POOL = {**portfolio_tool.MORE_THRESHOLDS, **portfolio_tool.SIZE_PASSES}


@pytest.mark.parametrize("name", list(WIDE_POOL))
def test_every_wide_and_size_pass_option_is_known_to_clang(name, toolchain, tmp_path):
    """clang-22 takes each ``--wide`` and ``--size-passes`` option (an unknown ``-mllvm`` option is an error) and
    compiles."""
    (tmp_path / "a.c").write_text(C_SOURCE)
    done = subprocess.run([str(toolchain.clang), "-Oz", "-c", "a.c", *WIDE_POOL[name]],
                          cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_the_chooser_measures_an_entry_of_pass_options_alone_as_clang_with_them(port_corpus):
    """An entry with clang's allocator compiles with its flags and nothing else (the allocator's streams carry no
    heuristic answer to replay, so they cannot stand in for clang): every module compiles, the empty entry is
    clang's object exactly, and the flags reach the compile."""
    names = [m.name for m in port_corpus]
    clangs = {"regalloc-evict": "heuristic", "regalloc-priority": "heuristic"}
    plain = portfolio_tool.sizes(port_corpus, names, clangs, (), 1)
    flagged = portfolio_tool.sizes(port_corpus, names, clangs, load_portfolio().candidates[0].flags, 1)
    assert all(row.ok for row in [*plain.values(), *flagged.values()])
    assert all(row.policy_text == row.heuristic_text for row in plain.values())
    assert any(flagged[n].policy_text != plain[n].policy_text for n in names)


def test_measure_prints_each_packages_total_bytes_over_clangs(capsys):
    """``portfolio measure``'s per-package lines: a package's ratio is its bytes over clang's (not a mean of module
    ratios), and its modules more than 1 % worse are counted apart from the other packages'."""

    def row(module: str, clang: int, mine: int) -> ModuleRow:
        return ModuleRow(module, clang, mine, clang, mine, None, mine / clang, 0, 0, 0.1, "ok")

    portfolio_tool.print_packages([row("big/a.c", 1000, 900), row("small/b.c", 100, 120), row("big/c.c", 1000, 1000)])
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["  big: 0.9500 of 2000 B, 0 of 2 modules > 1 % worse",
                     "  small: 1.2000 of 100 B, 1 of 1 modules > 1 % worse"]  # fmt: skip
