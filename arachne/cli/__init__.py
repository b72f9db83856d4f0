"""The `arachne` command line: thin typer commands over the library."""
