"""arachne's benchmarks, one tool: ``python -m benchmarks <subcommand> ...`` (see ``benchmarks/README.md``)."""
