"""MCP: the memory tools for agents (`tools`, taking and returning the `models`), served
over stdio or streamable HTTP (`serve`), as a client of a running memsvc (`gateway`)."""
