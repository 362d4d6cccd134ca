"""maintainer/ship_pretrained.py --unseen on real compiles: every shipped policy's figures on a corpus land in every
shipped provenance, one entry per corpus, and nothing else of the provenance changes."""

from __future__ import annotations

import json
import shutil

from maintainer import ship_pretrained
from optgym.policies import PRETRAINED_NAMES, pretrained_provenance
from optgym.policies.portfolio import load_portfolio


def test_unseen_figures_go_into_every_shipped_provenance(corpus, tmp_path, monkeypatch):
    tool = ship_pretrained
    copies = {}
    for problem in PRETRAINED_NAMES:
        copies[problem] = tmp_path / f"{problem}.provenance.json"
        shutil.copy(pretrained_provenance(problem), copies[problem])
    before = {problem: json.loads(path.read_text()) for problem, path in copies.items()}
    monkeypatch.setattr(tool, "pretrained_provenance", lambda problem="inline-size": copies[problem])
    shipped = pretrained_provenance("inline-size").read_bytes()

    assert tool.add_unseen([corpus.root], workers=1) == 0
    assert tool.add_unseen([corpus.root], workers=1) == 0  # measured again: the entry is replaced, not added
    for problem, path in copies.items():
        after = json.loads(path.read_text())
        entries = after["figures"].pop(tool.UNSEEN)
        (entry,) = [e for e in entries if e["corpus"] == corpus.root.name]
        assert entry["with"] == ["inline-size", *tool.shipped_scorers()]
        assert entry["candidates"] == load_portfolio().default_count  # what optgym-cc compiles a C object by default
        assert entry["all"]["evaluated"] == len(corpus) and entry["all"]["failed"] == 0
        assert entry["C"]["evaluated"] + entry["C++"]["evaluated"] == len(corpus)
        assert [e for e in entries if e is not entry] == before[problem]["figures"].pop(tool.UNSEEN, [])
        assert after == before[problem]  # nothing else of the provenance changed
    assert pretrained_provenance("inline-size").read_bytes() == shipped  # the package's own files untouched
