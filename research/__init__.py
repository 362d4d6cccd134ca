"""Research scripts: experiments and their measurements, run as ``python -m research.NAME`` from the repository
root. Not part of the product (nothing in ``src/`` imports them); their tests are marked ``research`` and run with
``make test-research``."""
