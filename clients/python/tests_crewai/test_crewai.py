"""CrewAI agents reach memsvc through its MCP tools (make test-clients, in a venv of its own:
CrewAI pins openai < 3 and mcp < 2, older than what the other frameworks here need).

No adapter module: a CrewAI `Agent` takes MCP servers (`mcps=[...]`) natively, and memsvc's
`memsvc mcp` is one. CrewAI's own `Memory` is not the place for memsvc (docs/surfaces/
clients.md says why). The agent below is the one the page prints, run as printed but for the
interpreter, address and token; its tools are called as CrewAI calls them.
"""

from __future__ import annotations

import os
import re

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

from typing import Any

from tests.test_client import READER, ROOT, WRITER, ServerTestCase

MCP_TOOLS = ("add_turns", "search_memory", "delete_turns", "memory_status")
PYTHON = os.environ.get("MEMSVC_PYTHON", str(ROOT / ".venv" / "bin" / "python"))


def page_agent(target: str, token: str) -> Any:
    """The page's CrewAI agent, with this memsvc's interpreter, address and `token`."""
    page = (ROOT / "docs" / "surfaces" / "clients.md").read_text()
    code = next(b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "crewai" in b)
    code = code.replace('"/home/you/memsvc/.venv/bin/python"', repr(PYTHON))
    code = code.replace('"127.0.0.1:50051"', repr(target)).replace(
        '"<a writer token>"', repr(token)
    )
    scope: dict[str, Any] = {}
    exec(compile(code, "clients.md", "exec"), scope)
    return scope["agent"]


class CrewAIMemoryTest(ServerTestCase):
    def tools(self, token: str = WRITER) -> dict[str, Any]:
        agent = page_agent(self.target, token)
        tools = agent.get_mcp_tools(agent.mcps)
        # CrewAI prefixes each tool's name with its server's
        return {n: t for t in tools for n in MCP_TOOLS if t.name.endswith("_" + n)}

    def test_the_agent_stores_finds_and_forgets(self) -> None:
        tools = self.tools()
        self.assertEqual(set(tools), set(MCP_TOOLS))
        said = tools["add_turns"].run(
            conversation_id="crew-1",
            turns=[
                {"speaker": "user", "text": "The spare key is under the blue flowerpot."},
                {"speaker": "assistant", "text": "Noted, the blue flowerpot."},
            ],
            wait=True,
        )
        self.assertIn("searchable now", str(said))
        found = str(
            tools["search_memory"].run(query="where is the key?", conversation_ids=["crew-1"])
        )
        self.assertIn("blue flowerpot", found)
        tools["delete_turns"].run(conversation_id="crew-1")
        gone = str(
            tools["search_memory"].run(query="where is the key?", conversation_ids=["crew-1"])
        )
        self.assertNotIn("flowerpot", gone)

    def test_a_reader_token_cannot_write(self) -> None:
        refused = self.tools(READER)["add_turns"].run(
            conversation_id="crew-2", turns=[{"speaker": "user", "text": "hello"}]
        )
        self.assertIn("PERMISSION_DENIED", str(refused))
