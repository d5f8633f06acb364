"""``python -m streamrag`` runs the command-line interface."""

from streamrag.cli import main

main()
