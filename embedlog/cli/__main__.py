"""`python -m embedlog.cli ...`: the `embedlog` command."""
from embedlog.cli.commands import main

main(prog_name="embedlog")
