"""MCP: the memory tools for agents, as a client of a running memsvc."""
