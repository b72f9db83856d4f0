"""``python -m arachne``: the ``arachne`` command, for machines where the package is on the path but not installed."""

from arachne.cli.app import main

main()
