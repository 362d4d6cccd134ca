"""Command line of the training side: ``optgym trace``, ``optgym vocab`` and ``optgym train …``.

Mounted in :mod:`optgym.cli`. Heavy imports (torch, stable-baselines3, pyarrow) happen inside the
commands, so ``optgym --help`` stays fast.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

console = Console(emoji=False)
err = Console(stderr=True, soft_wrap=True, emoji=False)

Workers = Annotated[
    int | None, typer.Option("--workers", "-j", "--parallel", help="worker processes (default: all cores)")
]
Timeout = Annotated[float, typer.Option(help="seconds of compiler time per module")]

# Options every trainer that runs on a corpus shares (one definition, so their --help cannot drift apart).
RunCorpus = Annotated[Path | None, typer.Option(help="corpus directory")]
RunOutput = Annotated[Path | None, typer.Option("-o", "--output", help="run directory to create")]
TrainSplit = Annotated[str | None, typer.Option(help="train on this side of the corpus's stored split")]
TestPercent = Annotated[
    float | None, typer.Option(help="make a split (this % of packages to test) if the corpus has none")
]
TrainLanguage = Annotated[str | None, typer.Option(help="train on only the C or only the C++ modules")]
Warmstart = Annotated[
    Path | None,
    typer.Option(help="BC directory or any policy dir to start from (ES also: an exported .onnx, or pretrained)"),
]
ValidationGroups = Annotated[
    str | None,
    typer.Option(help="hold these training packages back (comma-separated); the final policy: the best snapshot"),
]
ValidationPercent = Annotated[
    float, typer.Option(help="hold back this share of the training packages (a fixed draw) to pick the snapshot")
]
ValidationMaxWorse = Annotated[
    float | None,
    typer.Option(
        help="choose the final snapshot within this share of validation modules > 1 % worse (default: bytes alone)"
    ),
]
WarmVocab = Annotated[Path | None, typer.Option(help="vocab JSON (default: the warm start's)")]
Extras = Annotated[
    str,
    typer.Option(
        help="derived inputs after the features, comma-separated: heuristic, margin:A-B; 'residual' = "
        "heuristic,margin:threshold-cost_estimate; 'none' (see optgym.problems.inputs)"
    ),
]


def comma_list(text: str | None, shorthands: Mapping[str, Sequence[str]]) -> list[str]:
    """A comma-separated option → its names, each shorthand (alone or among others) expanded."""
    names: list[str] = []
    for name in filter(None, (e.strip() for e in (text or "").split(","))):
        names += shorthands.get(name, [name])
    return names


def parse_extras_option(text: str) -> list[str]:
    """``--extras`` → the derived input names (``residual`` — alone or among others — and ``none`` are shorthands)."""
    from optgym.problems.inputs import RESIDUAL_EXTRAS

    return [] if text.strip() == "none" else comma_list(text, {"residual": RESIDUAL_EXTRAS})


train_app = typer.Typer(
    add_completion=False,
    help="Train a policy: bc (behavioral cloning), ppo / a2c / dqn (stable-baselines3), es (evolution strategies).",
)


def _fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


Companions = Annotated[
    list[str] | None,
    typer.Option("--with", help="PROBLEM=POLICY: another problem of the same compiles decided by this policy"),
]


#: What ``--resume RUN`` may be told besides its budget: how the rest of the run is carried out, not what it learns.
RESUME_MAY_SET = ("workers", "final_eval")


def _typed(ctx: typer.Context, name: str) -> bool:
    """Whether option ``name`` was typed on the command line (not its default). By the source's name: typer
    vendors its own click, whose ParameterSource is not ``click.core``'s."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def _option_name(ctx: typer.Context, name: str) -> str:
    return next((p.opts[0] for p in ctx.command.params if p.name == name), name)


def resumed(ctx: typer.Context, run: Path, load: Callable[[Path], Any], budget: str, value: int | None) -> Any:
    """The configuration of ``run`` resumed: its recorded recipe (``load``), with the options typed beside ``--resume``
    that it may take (its ``budget`` option set to ``value`` when given, then :data:`RESUME_MAY_SET`); every other
    typed option is refused. Why refuse: the recipe is the run's ``config.toml``, and a resume that silently dropped a
    typed ``--sigma 0.5`` (or took it halfway through) trains something no config records. ``--no-final-eval`` with
    ``--resume`` used to be dropped this way."""
    cfg = load(run)
    cfg.output = str(run)
    typed = [n for n in ctx.params if n != "resume" and _typed(ctx, n)]
    recipe = [n for n in typed if n not in (*RESUME_MAY_SET, budget)]
    if recipe:
        _fail(f"--resume continues the recipe in {cfg.output}/config.toml, which "
              f"{', '.join(_option_name(ctx, n) for n in recipe)} would change; with --resume give only "
              f"{_option_name(ctx, budget)}, -j or --final-eval/--no-final-eval")  # fmt: skip
    for name in RESUME_MAY_SET:
        if name in typed and hasattr(cfg, name):
            setattr(cfg, name, ctx.params[name])
    if value is not None:
        setattr(cfg, budget, value)
    return cfg


def parse_companions(items: list[str] | None) -> list[tuple[str, str]]:
    """``--with PROBLEM=POLICY`` options as ``(problem, policy spec)`` pairs; a malformed one fails the command."""
    pairs = []
    for item in items or ():
        name, sep, spec = item.partition("=")
        if not sep or not spec:
            _fail(f"--with {item!r}: PROBLEM=POLICY, e.g. regalloc-evict=pretrained")
        pairs.append((name, spec))
    return pairs


def trace_command(
    corpus: Annotated[Path, typer.Option(help="corpus directory")],
    output: Annotated[Path, typer.Option("-o", "--output", help="trace directory to write")],
    problem: Annotated[str, typer.Option(help="decision problem")] = "inline-size",
    mode: Annotated[
        str, typer.Option(help="record (the heuristic) | collect (policy, sampling) | eval (policy, greedy)")
    ] = "record",
    policy: Annotated[str | None, typer.Option(help="policy spec for collect/eval (a run or policy dir, …)")] = None,
    split: Annotated[str | None, typer.Option(help="trace only this side of the corpus's split: train | test")] = None,
    sampling_rate: Annotated[float, typer.Option(help="fraction of the modules to trace (MLGO's sampling rate)")] = 1.0,
    workers: Workers = None,
    seed: Annotated[int, typer.Option(help="seed of module sampling and of stochastic policies")] = 0,
    timeout: Timeout = 120.0,
    overwrite: Annotated[bool, typer.Option(help="replace a trace already in --output")] = False,
) -> None:
    """Record every decision of a policy over a corpus as sharded Parquet (features, actions, sizes)."""
    from optgym.errors import OptgymError
    from optgym.train.trace import trace

    try:
        meta = trace(corpus, output, problem=problem, mode=mode, policy=policy, split=split,
                     sampling_rate=sampling_rate, workers=workers, seed=seed, timeout=timeout,
                     overwrite=overwrite)  # fmt: skip
    except OptgymError as e:
        _fail(str(e))
    s = meta["summary"]
    ratio = f"{s['size_ratio']:.4f}" if s["size_ratio"] else "—"
    console.print(
        f"[bold]trace[/] {output}: {s['modules']} modules ({len(s['failures'])} failed), {meta['decisions']} decisions "
        f"in {len(meta['shards'])} shard(s); text {s['text_bytes']} vs heuristic {s['heuristic_text_bytes']} "
        f"(ratio {ratio})",
        highlight=False,
    )
    for module, status in s["failures"].items():
        err.print(f"[yellow]failed[/] {module}: {status}", highlight=False)


def vocab_command(
    trace: Annotated[Path, typer.Argument(help="trace directory (optgym trace)")],
    output: Annotated[Path, typer.Option("-o", "--output", help="vocab JSON file to write")],
    sampling_fraction: Annotated[float, typer.Option(help="fraction of the decisions sampled for the quantiles")] = 1.0,
    buckets: Annotated[int, typer.Option(help="quantiles per feature (MLGO: 1000)")] = 1000,
    seed: Annotated[int, typer.Option(help="sampling seed")] = 0,
) -> None:
    """Per-feature quantile boundaries of a trace (MLGO's scheme), the input normalization of every policy."""
    from optgym.errors import OptgymError
    from optgym.train.vocab import vocab_from_trace

    try:
        vocab = vocab_from_trace(trace, sampling_fraction=sampling_fraction, num_buckets=buckets, seed=seed)
    except OptgymError as e:
        _fail(str(e))
    vocab.save(output)
    distinct = {n: len(set(b)) for n, b in vocab.features.items()}
    constant = [n for n, k in distinct.items() if k == 1]
    console.print(
        f"[bold]vocab[/] {output}: {len(distinct)} features from {vocab.samples} decisions; "
        f"{len(constant)} constant in this trace" + (f" ({', '.join(constant)})" if constant else ""),
        highlight=False,
    )


def _print_json(data: dict) -> None:
    console.print_json(json.dumps(data, default=str))


@train_app.command("bc")
def bc_command(
    trace: Annotated[Path, typer.Option(help="trace directory (optgym trace, record mode)")],
    vocab: Annotated[Path, typer.Option(help="vocab JSON (optgym vocab)")],
    output: Annotated[Path, typer.Option("-o", "--output", help="directory to write the cloned policy to")],
    epochs: Annotated[int, typer.Option(help="passes over the training part of the trace")] = 60,
    batch_size: Annotated[int, typer.Option(help="decisions per minibatch")] = 128,
    learning_rate: Annotated[float, typer.Option(help="Adam's learning rate")] = 2e-3,
    hidden: Annotated[str, typer.Option(help="hidden layer widths, comma-separated")] = "64,64",
    holdout: Annotated[float, typer.Option(help="fraction of the trace held out to measure agreement")] = 0.2,
    holdout_by: Annotated[str, typer.Option(help="module | decision | auto (module with ≥ 10 modules)")] = "auto",
    evaluate: Annotated[bool, typer.Option(help="compile the corpus with the cloned policy and report sizes")] = True,
    workers: Workers = None,
    seed: Annotated[int, typer.Option(help="seed of initialization, shuffling and the hold-out")] = 0,
    timeout: Timeout = 120.0,
    extras: Extras = "none",
) -> None:
    """Behavioral cloning of the heuristic from a trace; reports agreement and the cloned policy's size ratio."""
    from optgym.errors import OptgymError
    from optgym.train.bc import BCConfig, train_bc

    cfg = BCConfig(trace=str(trace), vocab=str(vocab), output=str(output), epochs=epochs, batch_size=batch_size,
                   learning_rate=learning_rate, hidden=[int(h) for h in hidden.split(",") if h],
                   holdout=holdout, holdout_by=holdout_by, evaluate=evaluate, workers=workers, seed=seed,
                   timeout=timeout, extras=parse_extras_option(extras))  # fmt: skip
    try:
        metrics = train_bc(cfg)
    except OptgymError as e:
        _fail(str(e))
    _report_bc(output, metrics)


def _report_bc(output: Path, m: dict) -> None:
    line = (
        f"[bold]bc[/] {output}/policy: agreement with the heuristic {m['holdout_agreement']:.4f} on "
        f"{m['holdout_decisions']} held-out decisions (by {m['holdout_by']}), {m['train_agreement']:.4f} on "
        f"{m['train_decisions']} trained on"
    )
    if m.get("size_ratio") is not None:
        line += (
            f"; greedy size ratio vs heuristic {m['size_ratio']:.4f} ({m['text_bytes']} / {m['heuristic_text_bytes']})"
        )
    if m.get("holdout_size_ratio") is not None:
        line += f", held-out modules {m['holdout_size_ratio']:.4f}"
    console.print(line, highlight=False)


def _sb3_command(algorithm: str):
    def command(
        ctx: typer.Context,
        corpus: RunCorpus = None,
        output: RunOutput = None,
        split: TrainSplit = None,
        test_percent: TestPercent = None,
        warmstart: Warmstart = None,
        vocab: WarmVocab = None,
        iterations: Annotated[
            int | None,
            typer.Option(help="iterations of --steps-per-iteration decisions (default 20; with --resume: a new total)"),
        ] = None,
        steps_per_iteration: Annotated[int, typer.Option(help="decisions per iteration, all workers together")] = 512,
        workers: Annotated[int, typer.Option("--workers", "-j", "--parallel", help="env worker processes")] = 2,
        snapshot_every: Annotated[int, typer.Option(help="snapshot every K iterations")] = 5,
        learning_rate: Annotated[float, typer.Option(help="learning rate")] = 3e-4,
        gamma: Annotated[
            float, typer.Option(help="discount (1: the sparse end-of-module reward reaches every step)")
        ] = 1.0,
        seed: Annotated[int, typer.Option(help="seed of the model, the envs and any split made")] = 0,
        timeout: Timeout = 120.0,
        final_eval: Annotated[bool, typer.Option(help="compile each split side with the final policy")] = True,
        optimal_decision: Annotated[
            bool,
            typer.Option(
                help="reward each decision by a one-flip look-ahead (OptimalDecision). EXPENSIVE: 2 extra full "
                "compiles per decision, an episode of T decisions costs 2T+1 compiles (1 000 decisions: minutes)"
            ),
        ] = False,
        critic: Annotated[
            str,
            typer.Option(
                help="learned: SB3's value head. heuristic: none, clang's own compile of each module is the "
                "baseline (the reward is measured against it), advantages unnormalized (PPO/A2C)"
            ),
        ] = "learned",
        temperature: Annotated[
            float,
            typer.Option(help="divide the warm start's action logits by T: sampling explores, greedy is unchanged"),
        ] = 1.0,
        credit: Annotated[
            str,
            typer.Option(
                help="all: a module's reward reaches each of its decisions. deviations: only those the rollout "
                "took differently from the greedy policy (needs --critic heuristic)"
            ),
        ] = "all",
        allowance: Annotated[
            str | None,
            typer.Option(
                help="start from the learned allowance over clang's threshold, gated by these 0/1 inputs "
                "('default': the ladder ES uses); a linear actor where only the allowance trains (needs --vocab). "
                "With --warmstart (an allowance): the gates it lacks, callee_survives say, start at weight 0"
            ),
        ] = None,
        language: TrainLanguage = None,
        validation_groups: ValidationGroups = None,
        validation_percent: ValidationPercent = 0.0,
        validation_max_worse: ValidationMaxWorse = None,
        resume: Annotated[Path | None, typer.Option(help="continue this run from its latest snapshot")] = None,
    ) -> None:
        from optgym.errors import OptgymError
        from optgym.train.sb3 import SB3Config, config_from_run, train_sb3

        try:
            if resume is not None:
                cfg = resumed(ctx, resume, config_from_run, "iterations", iterations)
                if cfg.algorithm != algorithm:
                    _fail(f"{resume} is a {cfg.algorithm} run, not {algorithm}")
                train_sb3(cfg, resume=True, say=console.print)
                return
            if corpus is None or output is None:
                _fail("--corpus and -o are required (or --resume RUN)")
            cfg = SB3Config(algorithm=algorithm, corpus=str(corpus), output=str(output), split=split,
                            test_percent=test_percent, vocab=str(vocab) if vocab else None,
                            warmstart=str(warmstart) if warmstart else None, iterations=iterations or 20,
                            steps_per_iteration=steps_per_iteration, workers=workers, snapshot_every=snapshot_every,
                            seed=seed, timeout=timeout, learning_rate=learning_rate, gamma=gamma,
                            final_eval=final_eval, optimal_decision=optimal_decision, critic=critic,
                            temperature=temperature, credit=credit,
                            allowance=_allowance_gates(allowance), language=language,
                            validation_groups=comma_list(validation_groups, {}),
                            validation_percent=validation_percent,
                            validation_max_worse=validation_max_worse)  # fmt: skip
            train_sb3(cfg, say=console.print)
        except OptgymError as e:
            _fail(str(e))

    command.__doc__ = (
        f"{algorithm.upper()} (stable-baselines3) on the compiler env with SubprocVecEnv workers; "
        "snapshots, --resume, TensorBoard and progress.csv in the run directory."
    )
    return command


for _algorithm in ("ppo", "a2c", "dqn"):
    train_app.command(_algorithm)(_sb3_command(_algorithm))


@train_app.callback(invoke_without_command=True)
def train_main(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Option(help="RUN/config.toml: run that training again")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="with --config: the new run directory")] = None,
) -> None:
    """Train a policy: bc, ppo / a2c / dqn (stable-baselines3), es (evolution strategies), pattern (compass search of
    the inline allowance), search + imitate, threshold; --config reruns one."""
    if ctx.invoked_subcommand is not None:
        return
    if config is None:
        console.print(ctx.get_help())
        raise typer.Exit(0)
    from optgym.errors import OptgymError
    from optgym.train.run import read_config

    try:
        algorithm, options, recorded = read_config(config)
        run = Path(config).parent if Path(config).is_file() else Path(config)
        target = output or run.with_name(run.name + "-repro")
        console.print(f"reproducing the {algorithm} run {run} into {target} (recorded with {recorded.get('clang')})")
        _rerun(algorithm, options, target)
    except OptgymError as e:
        _fail(str(e))


def _rerun(algorithm: str, options: dict, target: Path) -> None:
    """Run a recorded configuration again into ``target``."""
    if algorithm == "bc":
        from optgym.train.bc import BCConfig, train_bc

        cfg = BCConfig(**{**options, "output": str(target)})
        _report_bc(target, train_bc(cfg))
    elif algorithm == "es":
        from optgym.train.es import ESConfig, train_es

        train_es(ESConfig(**{**options, "output": str(target)}), say=console.print)
    elif algorithm == "imitate":
        from optgym.train.imitate import ImitateConfig, train_imitate

        train_imitate(ImitateConfig(**{**options, "output": str(target)}), say=console.print)
    elif algorithm == "pattern":
        from optgym.train.pattern import PatternConfig, train_pattern

        train_pattern(PatternConfig(**{**options, "output": str(target)}), say=console.print)
    elif algorithm == "threshold":
        from optgym.train.threshold import config_from_options, train_threshold

        train_threshold(config_from_options(options, target), say=console.print)
    else:
        from optgym.train.sb3 import SB3Config, train_sb3

        train_sb3(SB3Config(**{**options, "output": str(target), "algorithm": algorithm}), say=console.print)


def _allowance_gates(option: str | None) -> list[str]:
    """``--allowance`` → the gate names (``default``, alone or among others, is the ladder; none: no allowance)."""
    from optgym.policies.allowance import DEFAULT_GATES

    return comma_list(option, {"default": DEFAULT_GATES})


@train_app.command("es")
def es_command(
    ctx: typer.Context,
    corpus: RunCorpus = None,
    output: RunOutput = None,
    split: TrainSplit = None,
    test_percent: TestPercent = None,
    warmstart: Warmstart = None,
    vocab: WarmVocab = None,
    iterations: Annotated[
        int | None, typer.Option(help="ES iterations (default 10; with --resume: a new total)")
    ] = None,
    directions: Annotated[int, typer.Option(help="antithetic pairs of perturbations per iteration")] = 4,
    modules_per_iteration: Annotated[int | None, typer.Option(help="modules per iteration (default all)")] = None,
    sigma: Annotated[float, typer.Option(help="perturbation scale")] = 0.02,
    learning_rate: Annotated[float, typer.Option(help="Adam's step size")] = 0.01,
    workers: Workers = None,
    snapshot_every: Annotated[int, typer.Option(help="snapshot every K iterations")] = 5,
    seed: Annotated[int, typer.Option(help="seed of the perturbations and any split made")] = 0,
    timeout: Timeout = 120.0,
    final_eval: Annotated[bool, typer.Option(help="compile each split side with the final policy")] = True,
    resume: Annotated[Path | None, typer.Option(help="continue this run from its latest snapshot")] = None,
    problem: Annotated[
        str, typer.Option(help="decision problem (regalloc-evict trains a candidate scorer, no vocab)")
    ] = "inline-size",
    language: TrainLanguage = None,
    loss_weight: Annotated[
        float, typer.Option(help="a module made larger counts (1 + W) times its reward: fewer regressions")
    ] = 0.0,
    fitness: Annotated[
        str, typer.Option(help="mean: per-module rewards averaged (MLGO) | total: bytes saved over each batch")
    ] = "mean",
    worse_penalty: Annotated[
        float, typer.Option(help="subtract P × each batch's share of modules more than 1 % worse from its fitness")
    ] = 0.0,
    with_: Companions = None,
    scorer_hidden: Annotated[
        int, typer.Option(help="widen a linear candidate scorer by N hidden units (a residual scorer) first")
    ] = 0,
    shaping: Annotated[
        str, typer.Option(help="none: raw fitnesses | rank: centered ranks (one disaster cannot drown the rest)")
    ] = "none",
    batch: Annotated[
        str, typer.Option(help="uniform | size: each iteration's modules drawn evenly from quartiles of module size")
    ] = "uniform",
    anneal: Annotated[
        str, typer.Option(help="none | linear: the step size falls from --learning-rate towards zero over the run")
    ] = "none",
    allowance: Annotated[
        str | None,
        typer.Option(
            help="learn only an allowance over clang's inline threshold, gated by these 0/1 inputs "
            "(comma-separated at_most:F:K, at_least:F:K, cxx, callee_survives; 'default': the ladder), "
            "from clang's decisions or from --warmstart, an allowance with these gates (train imitate --allowance)"
        ),
    ] = None,
    validation_groups: ValidationGroups = None,
    validation_percent: ValidationPercent = 0.0,
    validation_max_worse: ValidationMaxWorse = None,
    heuristic_weight: Annotated[
        float,
        typer.Option(help="an allowance's weight on clang's answer: 4 only adds inlines; below 1 it can withdraw them"),
    ] = 4.0,
) -> None:
    """Evolution strategies (antithetic, MLGO's blackbox trainer) over whole-module compiles in parallel workers.

    Each iteration costs 2 × directions × modules compiles. With ``--with PROBLEM=POLICY`` every compile also
    has PROBLEM decided by that fixed policy, and the reward is both together against clang alone."""
    from optgym.errors import OptgymError
    from optgym.train.es import ESConfig, config_from_run, train_es

    try:
        if resume is not None:
            cfg = resumed(ctx, resume, config_from_run, "iterations", iterations)
            train_es(cfg, resume=True, say=console.print)
            return
        if corpus is None or output is None:
            _fail("--corpus and -o are required (or --resume RUN)")
        cfg = ESConfig(corpus=str(corpus), output=str(output), split=split, test_percent=test_percent,
                       vocab=str(vocab) if vocab else None, warmstart=str(warmstart) if warmstart else None,
                       iterations=iterations or 10, directions=directions, modules_per_iteration=modules_per_iteration,
                       sigma=sigma, learning_rate=learning_rate, workers=workers, snapshot_every=snapshot_every,
                       seed=seed, timeout=timeout, final_eval=final_eval, problem=problem,
                       language=language, loss_weight=loss_weight, fitness=fitness, worse_penalty=worse_penalty,
                       companions=[list(pair) for pair in parse_companions(with_)],
                       scorer_hidden=scorer_hidden, allowance=_allowance_gates(allowance), shaping=shaping,
                       batch=batch, anneal=anneal, validation_groups=comma_list(validation_groups, {}),
                       validation_percent=validation_percent, validation_max_worse=validation_max_worse,
                       heuristic_weight=heuristic_weight)  # fmt: skip
        train_es(cfg, say=console.print)
    except OptgymError as e:
        _fail(str(e))


@train_app.command("pattern")
def pattern_command(
    ctx: typer.Context,
    corpus: RunCorpus = None,
    output: RunOutput = None,
    split: Annotated[str | None, typer.Option(help="train on this side of the corpus's stored split")] = "train",
    language: Annotated[str | None, typer.Option(help="train on and decide only C or only C++")] = "C++",
    sample: Annotated[
        int | None, typer.Option(help="modules drawn (by --seed) evenly over four strata of size; 0: every one")
    ] = 400,
    hold_out_every: Annotated[
        int | None, typer.Option(help="leave out every K-th module by name (what `optgym evaluate --every K` checks)")
    ] = None,
    allowance: Annotated[
        str, typer.Option(help="the allowance's 0/1 gates (comma-separated; 'default': optgym.policies.allowance's)")
    ] = "default",
    warmstart: Annotated[
        Path | None,
        typer.Option(
            help="start from this allowance (its gates first: new ones start at 0; train imitate --allowance)"
        ),
    ] = None,
    step: Annotated[float, typer.Option(help="first step on each coordinate (a power of two, margin units)")] = 0.25,
    min_step: Annotated[float, typer.Option(help="a coordinate whose step falls below this is done")] = 1 / 64,
    max_worse: Annotated[
        float, typer.Option(help="largest share of the sample's modules a kept move may leave > 1 % worse")
    ] = 0.02,
    halves: Annotated[
        bool, typer.Option(help="keep a move only if neither half of the sample (split by package) grows")
    ] = False,
    order: Annotated[
        str, typer.Option(help="seeded: coordinates in turn, in a seeded order | ranked: probe all, best move first")
    ] = "seeded",
    repair: Annotated[
        bool, typer.Option(help="ranked, past the cap and stuck: take the probe losing regressions at fewest bytes")
    ] = False,
    store: Annotated[
        bool, typer.Option(help="replay trajectories other runs compiled (same modules and inputs); figures unchanged")
    ] = True,
    sweeps: Annotated[
        int | None, typer.Option(help="sweeps over the coordinates (default 8; with --resume: a new total)")
    ] = None,
    max_compiles: Annotated[int, typer.Option(help="stop once this many compiles are spent")] = 8000,
    workers: Workers = None,
    seed: Annotated[int, typer.Option(help="seed of the sample's draw and (seeded) of the coordinate order")] = 0,
    restarts: Annotated[
        int, typer.Option(help="searches on their own seeded samples; the best on the pool they share is kept")
    ] = 1,
    timeout: Timeout = 120.0,
    final_eval: Annotated[bool, typer.Option(help="compile each split side with the final policy")] = True,
    resume: Annotated[Path | None, typer.Option(help="continue this run after its latest sweep")] = None,
) -> None:
    """Compass search of the inline allowance on a fixed training sample, for the smallest total under a cap on the
    modules made worse; modules a candidate does not change are replayed, not compiled. See optgym.train.pattern."""
    from optgym.errors import OptgymError
    from optgym.train.pattern import PatternConfig, config_from_run, train_pattern

    try:
        if resume is not None:
            cfg = resumed(ctx, resume, config_from_run, "sweeps", sweeps)
            train_pattern(cfg, resume=True, say=console.print)
            return
        if corpus is None or output is None:
            _fail("--corpus and -o are required (or --resume RUN)")
        cfg = PatternConfig(corpus=str(corpus), output=str(output), split=split, language=language,
                            sample=sample or None, hold_out_every=hold_out_every, gates=_allowance_gates(allowance),
                            warmstart=str(warmstart) if warmstart else None,
                            step=step, min_step=min_step, max_worse=max_worse, halves=halves, order=order,
                            repair=repair, store=store, sweeps=sweeps or 8,
                            max_compiles=max_compiles, workers=workers, seed=seed, restarts=restarts,
                            timeout=timeout, final_eval=final_eval)  # fmt: skip
        train_pattern(cfg, say=console.print)
    except OptgymError as e:
        _fail(str(e))


@train_app.command("search")
def search_command(
    corpus: Annotated[Path, typer.Option(help="corpus directory")],
    output: Annotated[Path, typer.Option("-o", "--output", help="search directory (a rerun resumes it)")],
    budget: Annotated[int, typer.Option(help="compiles per module; a rerun with more extends the search")] = 1000,
    modules: Annotated[str | None, typer.Option(help="only the modules whose name matches this glob")] = None,
    sample: Annotated[
        int | None, typer.Option(help="search a draw of this many of the modules, even over size strata (by --seed)")
    ] = None,
    min_decisions: Annotated[int, typer.Option(help="leave modules with fewer decisions unsearched")] = 1,
    split: Annotated[str | None, typer.Option(help="search only this side of the corpus's split")] = None,
    language: Annotated[str | None, typer.Option(help="search only the C or only the C++ modules")] = None,
    start: Annotated[str, typer.Option(help="policy to start from and to follow after a flip")] = "heuristic",
    focus: Annotated[
        float,
        typer.Option(
            help="single flips try only this least-sure fraction of decisions (+ deviations): by the "
            "start policy's confidence, or the heuristic's cost margin; 1 = all"
        ),
    ] = 1.0,
    groups: Annotated[
        bool, typer.Option(help="once a pass of flips finds nothing, try inlining every call of one callee")
    ] = True,
    evolve: Annotated[bool, typer.Option(help="evolutionary moves once a pass of flips finds nothing")] = True,
    workers: Workers = None,
    seed: Annotated[int, typer.Option(help="seed of the evolutionary moves and of --sample")] = 0,
    timeout: Timeout = 120.0,
) -> None:
    """Per module, decision sequences smaller than the heuristic's: greedy single flips, every call of one
    callee, then evolution; every improvement verified byte-exact by a fresh compile. Resumable; see
    optgym.train.search."""
    from optgym.errors import OptgymError
    from optgym.train.search import SearchConfig, search, summary_table

    cfg = SearchConfig(corpus=str(corpus), output=str(output), budget=budget, workers=workers, modules=modules,
                       sample=sample, split=split, language=language, min_decisions=min_decisions, start=start,
                       focus=focus, groups=groups, evolve=evolve, seed=seed, timeout=timeout)  # fmt: skip
    try:
        meta = search(cfg, say=console.print)
    except OptgymError as e:
        _fail(str(e))
    console.print(summary_table(meta))
    for module, detail in meta["summary"]["failed"].items():
        err.print(f"[yellow]failed[/] {module}: {detail}", highlight=False)


@train_app.command("imitate")
def imitate_command(
    ctx: typer.Context,
    search: Annotated[
        list[Path] | None, typer.Option(help="search directory (optgym train search); repeatable")
    ] = None,
    output: RunOutput = None,
    vocab: Annotated[Path | None, typer.Option(help="vocab JSON (default: made from the search's states)")] = None,
    dagger_rounds: Annotated[
        int | None, typer.Option(help="DAgger rounds after cloning the search (default 0; with --resume: a new total)")
    ] = None,
    dagger_budget: Annotated[int, typer.Option(help="compiles per module of each DAgger search")] = 100,
    epochs: Annotated[int, typer.Option(help="passes over the demonstrations per round")] = 60,
    hidden: Annotated[str, typer.Option(help="hidden layer widths, comma-separated")] = "64,64",
    workers: Workers = None,
    seed: Annotated[int, typer.Option(help="seed of training and of the DAgger searches")] = 0,
    timeout: Timeout = 120.0,
    final_eval: Annotated[bool, typer.Option(help="compile each split side with the final policy")] = True,
    unsearched: Annotated[
        bool, typer.Option(help="also learn the heuristic's decisions on the modules a search skipped")
    ] = True,
    extras: Extras = "residual",
    allowance: Annotated[
        str | None,
        typer.Option(
            help="learn an allowance over clang's inline threshold gated by these 0/1 inputs ('default': the "
            "ladder ES uses), by logistic regression on the examined states, instead of a network"
        ),
    ] = None,
    l2: Annotated[float, typer.Option(help="with --allowance: ridge penalty on the gates' weights")] = 1.0,
    resume: Annotated[Path | None, typer.Option(help="continue this run after its latest round")] = None,
) -> None:
    """Learn the search's best decisions (behavioral cloning), then DAgger: search again from the states the
    policy reaches, aggregate, retrain. Snapshots per round, --resume, TensorBoard; see optgym.train.imitate."""
    from optgym.errors import OptgymError
    from optgym.train.imitate import ImitateConfig, config_from_run, train_imitate

    try:
        if resume is not None:
            cfg = resumed(ctx, resume, config_from_run, "dagger_rounds", dagger_rounds)
            train_imitate(cfg, resume=True, say=console.print)
            return
        if not search or output is None:
            _fail("--search and -o are required (or --resume RUN)")
        cfg = ImitateConfig(search=[str(s) for s in search], output=str(output), vocab=str(vocab) if vocab else None,
                            dagger_rounds=dagger_rounds or 0, dagger_budget=dagger_budget, epochs=epochs,
                            hidden=[int(h) for h in hidden.split(",") if h], workers=workers, seed=seed,
                            timeout=timeout, final_eval=final_eval, unsearched=unsearched,
                            extras=parse_extras_option(extras), allowance=_allowance_gates(allowance),
                            l2=l2)  # fmt: skip
        train_imitate(cfg, say=console.print)
    except OptgymError as e:
        _fail(str(e))


@train_app.command("threshold")
def threshold_command(
    corpus: Annotated[Path, typer.Option(help="corpus directory")],
    output: Annotated[Path, typer.Option("-o", "--output", help="run directory to create")],
    split: Annotated[str, typer.Option(help="tune on this side of the corpus's stored split (all: every module)")] = (
        "train"
    ),
    up: Annotated[
        str,
        typer.Option(
            help="candidates, comma-separated: K (also inline where cost − threshold ≤ K), K/U (only where "
            "the callee has ≤ U users), K@FEATURE<=V or K@FEATURE>=V (only where that raw feature is within V), "
            "noK… with the same gates (take clang's inline away where cost − threshold ≥ −K), "
            "rules joined by + (each admits call sites), none (clang's own)"
        ),
    ] = "none,0,2,5,10,10/2,10/4",
    languages: Annotated[
        str, typer.Option(help="languages to tune, comma-separated (C++, C); the others keep clang's decisions")
    ] = "C++,C",
    samples: Annotated[
        int, typer.Option(help="independent module samples (seeds SEED, SEED+1, …); the bar must hold on each")
    ] = 1,
    max_regressed: Annotated[
        float, typer.Option(help="largest share of a language's modules > 1 % worse a candidate may have")
    ] = 0.02,
    sampling_rate: Annotated[float, typer.Option(help="tune on this reproducible fraction of the modules")] = 1.0,
    seed: Annotated[int, typer.Option(help="seed of the module sample")] = 0,
    workers: Workers = None,
    timeout: Timeout = 120.0,
    final_eval: Annotated[bool, typer.Option(help="compile each split side with the final policy")] = True,
) -> None:
    """Clang's heuristic with its cost threshold moved, the shift tuned per language on the corpus (one compile
    per module and candidate); the result is an ordinary policy (export, serve, warm-start ES). See
    optgym.train.threshold."""
    from optgym.errors import OptgymError
    from optgym.train.threshold import ThresholdConfig, train_threshold

    cfg = ThresholdConfig(corpus=str(corpus), output=str(output), split=None if split == "all" else split,
                          up=[v.strip() for v in up.split(",") if v.strip()],
                          max_regressed=max_regressed, sampling_rate=sampling_rate, seed=seed, workers=workers,
                          timeout=timeout, final_eval=final_eval, samples=samples,
                          languages=[v.strip() for v in languages.split(",") if v.strip()])  # fmt: skip
    try:
        train_threshold(cfg, say=console.print)
    except OptgymError as e:
        _fail(str(e))
