"""Evaluation: a policy against the compiler's heuristic, per module, with reports, plots and diffs."""

from optgym.train.evaluation import ModuleRow, evaluate, summarize

__all__ = ["ModuleRow", "evaluate", "summarize"]
