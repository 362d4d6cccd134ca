"""clang's optimization record (``-opt-record-file``): what each decision was about, by name.

The interactive channel carries numbers only — a policy never learns *which* function a call site
calls. The optimization record does: with ``-opt-record-passes inline``, clang-22's ML inline advisor
writes one YAML remark per decision (pass ``inline-ml``; ``InliningSuccess``,
``InliningSuccessWithCalleeDeleted``, ``IniningNotAttempted`` …), in decision order, each with the
``Callee`` and the caller (``Function``). Offline tools read it — the search's "inline every call of
one function" move — without slowing the channel: the record is read after the compile.

A deliberately small reader: remark documents are flat, and the fields read here are plain scalars,
so a line scan is exact and needs no YAML library on the hot path of a search.
"""

from __future__ import annotations

import re
from pathlib import Path

_FIELD = re.compile(r"^(Pass|Name|Function): +(.*)$", re.M)
_ARG = re.compile(r"^ +- (\w+): +(.*)$", re.M)


def record_flags(path: Path | str, passes: str) -> list[str]:
    """``-cc1`` flags that write the remarks of the passes matching the regex ``passes`` to ``path``."""
    return ["-opt-record-file", str(path), "-opt-record-passes", passes]


def _scalar(text: str) -> str:
    """A YAML plain or single-quoted scalar (``'a''b'`` is ``a'b``)."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1].replace("''", "'")
    return text


def read_remarks(path: Path | str, pass_name: str) -> list[dict[str, str]]:
    """The remarks of pass ``pass_name`` in ``path``, in the order clang wrote them: each the remark's
    ``Name`` and ``Function`` plus its arguments (``Callee``, features …), every value a string."""
    remarks = []
    for doc in Path(path).read_text(errors="replace").split("\n--- "):
        fields = {k: _scalar(v) for k, v in _FIELD.findall(doc)}
        if fields.get("Pass") != pass_name:
            continue
        fields.pop("Pass")
        for key, value in _ARG.findall(doc):
            fields.setdefault(key, _scalar(value))
        remarks.append(fields)
    return remarks
