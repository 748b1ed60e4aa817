"""The `memsvc` command: `serve` and `health` (`main`), and the client commands of a running
server (`client`)."""
