"""`python -m memsvc ...` runs the `memsvc` command."""

from memsvc.transports.cli.main import main

if __name__ == "__main__":  # not when a render process starts (spawn)
    main()
