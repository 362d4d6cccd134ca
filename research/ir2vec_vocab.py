#!/usr/bin/env python3
"""Train an IR2Vec seed vocabulary for clang-22's ML inliner, and check that clang takes it.

    .venv/bin/python -m research.ir2vec_vocab build CORPUS [CORPUS …] -o vocab.json [--dim 75] [-j N]
    .venv/bin/python -m research.ir2vec_vocab check vocab.json CORPUS [--module NAME] [--time N]

Why: given ``-mllvm -ml-inliner-ir2vec-vocab-file=V -mllvm -ir2vec-vocab-path=V`` (both: the first turns
the features on, the second is what the IR2Vec analysis reads), clang-22 adds ``callee_embedding`` and
``caller_embedding`` (float, the vocabulary's dimension) to every inlining decision. Debian ships no
vocabulary, so one is trained here from the corpus the policy trains on. A first, self-contained try
(issue 7, item 4): it touches none of optgym's packages.

``build``, in stages (each one's time is printed):

1. modules — every module of the given corpora (one per Debian package, say); ``--exclude`` drops
   corpora by directory name, so held-out packages never reach the vocabulary.
2. triplets — ``llvm-ir2vec triplets`` on each module's bitcode, in parallel (optgym's executor and
   its progress bar). Each line is ``head<TAB>tail<TAB>relation`` (OpenKE's ``train2id`` order) over
   entity ids, after a ``MAX_RELATION=N`` line; relations are Type 0, Next 1 and Arg k = 2 + k. Duplicates
   are dropped, as upstream's generator does: the knowledge graph is a set of facts.
3. entities — ``llvm-ir2vec entities``: ``N`` then ``name<TAB>id`` per line. The entity set is fixed by
   LLVM (opcodes, canonical types, operand kinds and compare predicates; 110 in LLVM 22), not by the
   input, so it runs once.
4. train — TransE (Bordes et al.), as upstream trains its vocabulary with OpenKE: ``h + r ≈ t`` under
   the L1 norm, margin ranking against one corrupted head or tail per fact, entity vectors renormalized
   to unit length after each step. CPU, one thread, seeded: the same inputs give the same file.
5. write — the JSON clang reads: three objects, ``Opcodes``, ``Types`` and ``Arguments`` (operand kinds
   *and* the ICmp/FCmp predicates), each mapping an entity name to a list of floats; every vector of
   every section must have the same length, which *is* the dimension (clang has no default; upstream's
   own vocabulary is 75-D). Written to a temporary file and renamed.

``check`` compiles one module interactively with the vocabulary (answering with clang's heuristic)
and reports the header's embedding features and whether the vectors are non-zero and differ between
call sites; ``--time N`` also times N modules with and without the two flags.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from optgym.corpus import Corpus, Module
from optgym.files import atomic_write_bytes
from optgym.parallel import run_tasks
from optgym.problems.inline_size import InlineSize
from optgym.rollout.episode import Episode
from optgym.toolchain import find_toolchain
from optgym.toolchain.llvm import Toolchain

DEFAULT_DIM = 75  # upstream's seedEmbeddingVocab75D.json; clang takes whatever the file holds
SECTIONS = ("Opcodes", "Types", "Arguments")
OPERAND_KINDS = ("Function", "Pointer", "Constant", "Variable")
EMBEDDING_FEATURES = ("callee_embedding", "caller_embedding")


class VocabError(RuntimeError):
    """The tools or clang did not do what this script relies on (named in the message)."""


def embedding_flags(vocab: Path) -> list[str]:
    """The two flags clang-22 needs: the inliner's switch and the IR2Vec analysis' own path.

    With only the first, clang fails ("IR2Vec vocabulary file path not specified"); with only the
    second, the inliner sends no embeddings at all.
    """
    vocab = Path(vocab).resolve()
    return ["-mllvm", f"-ml-inliner-ir2vec-vocab-file={vocab}", "-mllvm", f"-ir2vec-vocab-path={vocab}"]


@contextmanager
def stage(name: str, timings: dict[str, float]) -> Iterator[None]:
    """Time one stage, print it and keep it (the report wants every stage's cost)."""
    t0 = time.perf_counter()
    yield
    timings[name] = time.perf_counter() - t0
    print(f"[{name}] {timings[name]:.2f} s", flush=True)


# -- stage 1: modules ----------------------------------------------------------------------------


def corpus_modules(corpora: Sequence[Path], exclude: Sequence[str] = (), split: str | None = None) -> list[Module]:
    """Every module of ``corpora`` except those of corpora whose directory name is in ``exclude`` — and, with
    ``split``, only that side of each corpus's split (the vocabulary must not have seen held-out packages)."""
    skip = set(exclude)
    modules: list[Module] = []
    for root in corpora:
        if Path(root).resolve().name in skip:
            continue
        modules.extend(Corpus(root, split=split))
    return modules


# -- stage 2: triplets ---------------------------------------------------------------------------


@dataclass
class TripletResult:
    """One module's distinct triplets (int32 [N, 3]: head, tail, relation), or why there are none."""

    module: str
    triplets: np.ndarray
    max_relation: int = 0
    error: str = ""


def parse_triplets(text: str) -> tuple[np.ndarray, int]:
    """``llvm-ir2vec triplets`` output → (distinct triplets, MAX_RELATION)."""
    header, _, body = text.partition("\n")
    if not header.startswith("MAX_RELATION="):
        raise VocabError(f"llvm-ir2vec triplets output does not start with MAX_RELATION=: {header[:80]!r}")
    numbers = np.array(body.split(), dtype=np.int32)
    if numbers.size % 3:
        raise VocabError("llvm-ir2vec triplets output is not made of three-number lines")
    triplets = numbers.reshape(-1, 3)
    if len(triplets):
        triplets = np.unique(triplets, axis=0)
    return triplets, int(header.split("=", 1)[1])


def module_triplets(task: tuple[str, str, str]) -> TripletResult:
    """Run ``llvm-ir2vec triplets`` on one module (a worker task: plain strings in, arrays out)."""
    tool, name, bitcode = task
    proc = subprocess.run([tool, "triplets", bitcode, "-o", "-"], capture_output=True, text=True, check=False)
    empty = np.zeros((0, 3), dtype=np.int32)
    if proc.returncode != 0:
        return TripletResult(name, empty, error=proc.stderr.strip()[-500:] or f"exit {proc.returncode}")
    triplets, max_relation = parse_triplets(proc.stdout)
    return TripletResult(name, triplets, max_relation)


def collect_triplets(
    tool: Path, modules: Sequence[Module], workers: int | None = None, progress: bool = True
) -> tuple[np.ndarray, int, list[TripletResult]]:
    """The distinct triplets of all ``modules``, the number of relations, and the modules that failed."""
    tasks = [(str(tool), m.name, str(m.bitcode)) for m in modules]
    parts: list[np.ndarray] = []
    failed: list[TripletResult] = []
    max_relation = 1  # Type and Next exist even in a corpus without a single call argument
    for _, result in run_tasks(module_triplets, tasks, workers=workers, description="triplets", progress=progress):
        if result.error:
            failed.append(result)
            continue
        parts.append(result.triplets)
        max_relation = max(max_relation, result.max_relation)
    if not parts or not sum(len(p) for p in parts):
        raise VocabError(f"no triplets from {len(modules)} modules ({len(failed)} failed)")
    triplets = np.unique(np.concatenate(parts), axis=0)
    return triplets, max_relation + 1, failed


# -- stage 3: entities ---------------------------------------------------------------------------


def read_entities(tool: Path) -> list[str]:
    """Entity names by id, from ``llvm-ir2vec entities`` (the count line, then ``name<TAB>id``)."""
    proc = subprocess.run([str(tool), "entities", "-o", "-"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise VocabError(f"llvm-ir2vec entities failed: {proc.stderr.strip()[-500:]}")
    lines = proc.stdout.strip().splitlines()
    count = int(lines[0])
    by_id: dict[int, str] = {}
    for line in lines[1:]:
        name, ident = line.rsplit("\t", 1)
        by_id[int(ident)] = name
    if sorted(by_id) != list(range(count)):
        raise VocabError(f"llvm-ir2vec entities: expected ids 0..{count - 1}, got {len(by_id)} entries")
    return [by_id[i] for i in range(count)]


def section_of(name: str) -> str:
    """Which vocabulary section an entity belongs to, by LLVM's naming of the three kinds."""
    if name in OPERAND_KINDS or name.startswith(("ICMP_", "FCMP_")):
        return "Arguments"
    if name.endswith("Ty"):
        return "Types"
    return "Opcodes"


def sections(entities: Sequence[str]) -> dict[str, list[int]]:
    """Entity ids per section; refuses an ordering that is not opcodes, then types, then arguments.

    LLVM lays the vocabulary out in that order, so a name rule that broke it would be a sign that
    a new LLVM renamed something — better to stop than to write a vocabulary with misfiled keys.
    """
    kinds = [section_of(n) for n in entities]
    order = [SECTIONS.index(k) for k in kinds]
    if order != sorted(order) or set(kinds) != set(SECTIONS):
        raise VocabError("llvm-ir2vec entities are not opcodes, then types, then arguments")
    return {s: [i for i, k in enumerate(kinds) if k == s] for s in SECTIONS}


# -- stage 4: TransE -----------------------------------------------------------------------------


@dataclass
class TransEConfig:
    dim: int = DEFAULT_DIM
    epochs: int = 20
    batch_size: int = 1024
    lr: float = 0.01
    margin: float = 1.0
    seed: int = 0


@dataclass
class TransEStats:
    losses: list[float] = field(default_factory=list)  # mean margin loss per epoch
    mean_rank: float = 0.0  # tail prediction on the training facts (raw), out of the entity count
    hits_at_10: float = 0.0


def train_transe(
    triplets: np.ndarray, n_entities: int, n_relations: int, config: TransEConfig
) -> tuple[np.ndarray, TransEStats]:
    """Entity embeddings (float32 [n_entities, dim]) that make ``head + relation ≈ tail`` (L1).

    One corrupted fact per true one, head or tail replaced by a uniform entity, unfiltered (a
    corruption that happens to be a true fact only costs a little signal). Entity vectors are
    kept on the unit sphere, as in the TransE paper, so the loss cannot be lowered by growing norms.
    """
    import torch  # not at import: run_tasks' workers load this file and need no torch

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)
    bound = 6.0 / config.dim**0.5
    ent = torch.nn.Parameter(torch.empty(n_entities, config.dim).uniform_(-bound, bound, generator=gen))
    rel = torch.nn.Parameter(torch.empty(n_relations, config.dim).uniform_(-bound, bound, generator=gen))
    with torch.no_grad():
        rel /= rel.norm(dim=1, keepdim=True)
        ent /= ent.norm(dim=1, keepdim=True)
    opt = torch.optim.Adam([ent, rel], lr=config.lr)
    facts = torch.as_tensor(triplets, dtype=torch.long)
    h_all, t_all, r_all = facts[:, 0], facts[:, 1], facts[:, 2]
    stats = TransEStats()
    for _ in range(config.epochs):
        order = torch.randperm(len(facts), generator=gen)
        total = 0.0
        for start in range(0, len(facts), config.batch_size):
            idx = order[start : start + config.batch_size]
            h, t, r = h_all[idx], t_all[idx], r_all[idx]
            random_ent = torch.randint(0, n_entities, (len(idx),), generator=gen)
            corrupt_head = torch.rand(len(idx), generator=gen) < 0.5
            h_neg = torch.where(corrupt_head, random_ent, h)
            t_neg = torch.where(corrupt_head, t, random_ent)
            pos = (ent[h] + rel[r] - ent[t]).abs().sum(dim=1)
            neg = (ent[h_neg] + rel[r] - ent[t_neg]).abs().sum(dim=1)
            loss = torch.relu(config.margin + pos - neg).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            with torch.no_grad():
                ent /= ent.norm(dim=1, keepdim=True).clamp_min(1e-12)
            total += loss.item() * len(idx)
        stats.losses.append(total / len(facts))
    with torch.no_grad():  # how well the embeddings rank the true tail among every entity
        sample = facts[torch.randperm(len(facts), generator=gen)[:5000]]
        guess = ent[sample[:, 0]] + rel[sample[:, 2]]
        dist = torch.cdist(guess, ent, p=1)
        true = dist.gather(1, sample[:, 1:2])
        rank = (dist < true).sum(dim=1) + 1
        stats.mean_rank = rank.float().mean().item()
        stats.hits_at_10 = (rank <= 10).float().mean().item()
    return ent.detach().numpy().astype(np.float32), stats


# -- stage 5: the vocabulary file ----------------------------------------------------------------


def vocabulary(entities: Sequence[str], embeddings: np.ndarray) -> dict[str, dict[str, list[float]]]:
    """The JSON object clang reads: ``{"Opcodes": {name: [..]}, "Types": {..}, "Arguments": {..}}``."""
    return {
        section: {entities[i]: [round(float(x), 6) for x in embeddings[i]] for i in ids}
        for section, ids in sections(entities).items()
    }


def write_vocabulary(path: Path, vocab: dict) -> None:
    """Atomically: a compile started meanwhile reads the old file or the new one, never half of one."""
    atomic_write_bytes(Path(path), json.dumps(vocab, separators=(",", ":")).encode() + b"\n")


def build(
    corpora: Sequence[Path],
    output: Path,
    *,
    exclude: Sequence[str] = (),
    split: str | None = None,
    config: TransEConfig | None = None,
    workers: int | None = None,
    progress: bool = True,
    toolchain: Toolchain | None = None,
) -> dict:
    """All five stages; returns a summary (timings, counts, training figures)."""
    config = config or TransEConfig()
    toolchain = toolchain or find_toolchain()
    tool = toolchain.tool("llvm-ir2vec")
    timings: dict[str, float] = {}
    with stage("modules", timings):
        modules = corpus_modules(corpora, exclude, split)
        print(f"  {len(modules)} modules from {len(corpora)} corpora")
    if not modules:
        raise VocabError("no modules to train on")
    with stage("triplets", timings):
        triplets, n_relations, failed = collect_triplets(tool, modules, workers, progress)
        print(f"  {len(triplets)} distinct triplets, {n_relations} relations, {len(failed)} modules failed")
        for f in failed[:5]:
            print(f"  failed: {f.module}: {f.error}")
    with stage("entities", timings):
        entities = read_entities(tool)
        print(f"  {len(entities)} entities")
    if int(triplets[:, :2].max()) >= len(entities):
        raise VocabError("a triplet names an entity id beyond llvm-ir2vec's entity list")
    with stage("train", timings):
        embeddings, stats = train_transe(triplets, len(entities), n_relations, config)
        print(
            f"  dim {config.dim}, {config.epochs} epochs, loss {stats.losses[0]:.4f} → {stats.losses[-1]:.4f}, "
            f"tail mean rank {stats.mean_rank:.1f}/{len(entities)}, hits@10 {stats.hits_at_10:.2f}"
        )
    with stage("write", timings):
        write_vocabulary(output, vocabulary(entities, embeddings))
        print(f"  {output}")
    return {
        "modules": len(modules),
        "failed_modules": len(failed),
        "triplets": len(triplets),
        "relations": n_relations,
        "entities": len(entities),
        "dim": config.dim,
        "losses": stats.losses,
        "mean_rank": stats.mean_rank,
        "hits_at_10": stats.hits_at_10,
        "timings": timings,
    }


# -- check: clang takes the vocabulary -----------------------------------------------------------


def vocab_dimension(vocab: Path) -> int:
    """The length of the vocabulary's vectors (what clang's embedding features will have)."""
    data = json.loads(Path(vocab).read_text())
    return len(next(iter(data["Opcodes"].values())))


@dataclass
class EmbeddingCheck:
    """What one interactive compile with the vocabulary showed."""

    module: str
    status: str
    stderr_tail: str = ""
    features: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)  # name → (type, shape)
    decisions: int = 0
    zero_vectors: int = 0  # callee/caller vectors that are all zero
    distinct_callee: int = 0  # distinct callee_embedding vectors over the module's decisions
    distinct_caller: int = 0
    text_bytes: float | None = None


def check_embeddings(
    vocab: Path | None, module: Module, toolchain: Toolchain, *, inspect: bool = True, timeout: float = 120.0
) -> EmbeddingCheck:
    """Compile ``module`` answering with clang's heuristic, with the embedding flags (``vocab=None``:
    without), and report the header and (``inspect``) the embedding values seen. Timing runs pass
    ``inspect=False`` so that both arms cost the host the same: only the heuristic's answer is read."""
    problem = InlineSize()
    flags = embedding_flags(vocab) if vocab is not None else []
    callee: set[bytes] = set()
    caller: set[bytes] = set()
    zero = 0
    features: dict[str, tuple[str, tuple[int, ...]]] = {}
    with Episode(problem, module, toolchain, timeout=timeout, extra_flags=flags) as ep:
        obs = ep.begin()
        if ep.view is not None:
            features = {s.name: (s.type, s.shape) for s in ep.view.header.features}
        while obs is not None:
            if inspect and "callee_embedding" in features:
                rec = obs.as_dict()
                a, b = rec["callee_embedding"], rec["caller_embedding"]
                zero += int(not a.any()) + int(not b.any())
                callee.add(a.tobytes())
                caller.add(b.tobytes())
            obs = ep.act(ep.heuristic_action())
    result = ep.result
    assert result is not None
    return EmbeddingCheck(
        module=module.name,
        status=result.status,
        stderr_tail=result.stderr_tail,
        features=features,
        decisions=result.decisions,
        zero_vectors=zero,
        distinct_callee=len(callee),
        distinct_caller=len(caller),
        text_bytes=result.metrics.get("text_bytes"),
    )


@dataclass
class Timing:
    module: str
    decisions: int
    wall: dict[str, float]  # best of the repeats, per arm
    cpu: dict[str, float]  # clang's user+system CPU, best of the repeats, per arm
    same_size: bool  # the heuristic's object has the same text size with and without the flags


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_module(vocab: Path, module: Module, toolchain: Toolchain, repeats: int = 3) -> Timing:
    """Heuristic-answered interactive compiles with and without the embeddings, alternated.

    CPU time (of the reaped compiler, from ``RUSAGE_CHILDREN``) is reported beside wall time: on a
    machine shared with other jobs the CPU figure is the one that does not depend on their load.
    """
    wall: dict[str, float] = {"plain": float("inf"), "ir2vec": float("inf")}
    cpu = dict(wall)
    decisions = 0
    sizes: set[float | None] = set()
    for _ in range(repeats):
        for arm, v in (("plain", None), ("ir2vec", vocab)):
            c0, t0 = _children_cpu(), time.perf_counter()
            res = check_embeddings(v, module, toolchain, inspect=False)
            elapsed, used = time.perf_counter() - t0, _children_cpu() - c0
            if res.status != "ok":
                raise VocabError(f"{module.name} ({arm}): {res.status}\n{res.stderr_tail}")
            wall[arm], cpu[arm] = min(wall[arm], elapsed), min(cpu[arm], used)
            decisions = res.decisions
            sizes.add(res.text_bytes)
    return Timing(module.name, decisions, wall, cpu, same_size=len(sizes) == 1)


def check(vocab: Path, corpus: Path, module_name: str | None, time_n: int, repeats: int) -> int:
    """The ``check`` command: header and values on one module, then optionally timings."""
    toolchain = find_toolchain((InlineSize.hook,))
    corp = Corpus(corpus)
    by_size = sorted(corp, key=lambda m: m.bitcode.stat().st_size, reverse=True)
    module = corp[module_name] if module_name else by_size[0]
    dim = vocab_dimension(vocab)
    res = check_embeddings(vocab, module, toolchain)
    if res.status != "ok":
        print(f"{module.name}: {res.status}\n{res.stderr_tail}", file=sys.stderr)
        return 1
    emb = {n: res.features.get(n) for n in EMBEDDING_FEATURES}
    print(f"{module.name}: {res.decisions} decisions; {len(res.features)} features; embeddings {emb}")
    print(f"  all-zero vectors {res.zero_vectors}; distinct callee {res.distinct_callee}, caller {res.distinct_caller}")
    ok = all(e == ("float", (dim,)) for e in emb.values()) and res.zero_vectors == 0
    ok = ok and (res.decisions < 2 or max(res.distinct_callee, res.distinct_caller) > 1)
    print("header and values: " + ("OK" if ok else "NOT as expected"))
    if time_n:
        rows = [time_module(vocab, m, toolchain, repeats) for m in by_size[:time_n]]
        for t in rows:
            print(
                f"  {t.module}: {t.decisions} decisions; wall {t.wall['plain']:.3f} → {t.wall['ir2vec']:.3f} s "
                f"(×{t.wall['ir2vec'] / t.wall['plain']:.2f}); clang CPU {t.cpu['plain']:.3f} → "
                f"{t.cpu['ir2vec']:.3f} s (×{t.cpu['ir2vec'] / t.cpu['plain']:.2f}); same size: {t.same_size}"
            )
        for kind in ("wall", "cpu"):
            plain = sum(getattr(t, kind)["plain"] for t in rows)
            emb_total = sum(getattr(t, kind)["ir2vec"] for t in rows)
            print(f"  total {kind}: {plain:.3f} → {emb_total:.3f} s, ratio ×{emb_total / plain:.2f}")
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="train a vocabulary from corpora")
    b.add_argument("corpora", type=Path, nargs="+", help="corpus directories (corpus_description.json)")
    b.add_argument("-o", "--output", type=Path, required=True)
    b.add_argument("--exclude", nargs="*", default=[], help="corpus directory names to leave out (held out)")
    b.add_argument("--split", default=None, help="only this side of each corpus's split (train)")
    b.add_argument("--dim", type=int, default=DEFAULT_DIM)
    b.add_argument("--epochs", type=int, default=TransEConfig.epochs)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("-j", "--workers", type=int, default=None)
    b.add_argument("--no-progress", action="store_true")
    c = sub.add_parser("check", help="compile with the vocabulary: header, values, timings")
    c.add_argument("vocab", type=Path)
    c.add_argument("corpus", type=Path)
    c.add_argument("--module", default=None, help="default: the module with the largest bitcode")
    c.add_argument("--time", type=int, default=0, metavar="N", help="time the N largest modules with/without")
    c.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.command == "build":
        config = TransEConfig(dim=args.dim, epochs=args.epochs, seed=args.seed)
        summary = build(
            args.corpora,
            args.output,
            exclude=args.exclude,
            split=args.split,
            config=config,
            workers=args.workers,
            progress=not args.no_progress,
        )
        print(json.dumps({k: v for k, v in summary.items() if k != "losses"}))
        return 0
    return check(args.vocab, args.corpus, args.module, args.time, args.repeats)


if __name__ == "__main__":
    sys.exit(main())
