"""``python -m benchmarks <subcommand> ...``: see ``benchmarks/README.md``."""

from benchmarks import common  # noqa: F401 (first: its thread settings precede any numpy import)
from benchmarks.cli import main

main()
