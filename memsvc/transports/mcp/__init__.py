"""MCP: the memory tools for agents (`tools`, taking and returning the `models`; which
calls without a request_id are retries: `retries`), served over stdio or streamable HTTP
(`serve`), as a client of a running memsvc (`gateway`)."""
