"""The ``sapo-async`` command line (typer). One module per group of commands."""
