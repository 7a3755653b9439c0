"""``python -m contextfold``: the CLI."""

from .cli import main

main()
