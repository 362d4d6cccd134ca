"""Release steps: shipping a trained policy with its provenance (``python -m maintainer.ship_pretrained``), choosing
and measuring the C portfolio (``python -m maintainer.portfolio``), picking a snapshot (``python -m
maintainer.pick_snapshot``). Run from the repository root; not imported by the product."""
