"""`python -m memsvc ...` runs the `memsvc` command."""

from memsvc.transports.cli.main import main

main()
