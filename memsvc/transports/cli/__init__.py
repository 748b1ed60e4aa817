"""The `memsvc` command: `serve`, `health`, `migrate` and `tune` (`main`; `probe` checks
health, `tune` measures the runtimes), and the client commands of a running server
(`client`, with `append`, `reindex`, `mcp` and the `connection` every command
shares)."""
