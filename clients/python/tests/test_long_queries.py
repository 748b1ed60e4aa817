"""A query over the server's limits (issue 83, item 1): the frameworks' own stores take any
length, and a 5,432-character last message made LlamaIndex's `aget` raise
INVALID_ARGUMENT (the chat turn failed), ADK's `search_memory` raise (PreloadMemoryTool
then logged it and gave the model no memory) and LangChain's retriever raise. Every
adapter now asks the server to cut such a query to its end (EmbedDbRequest.
keep_query_end: the last words of a chat are what is asked now), and finds the memory the
end asks about. The rule is the integrations page's."""

from __future__ import annotations

import asyncio

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from memsvc_client import MemoryClient, pb
from memsvc_client.integrations.google_adk import MemsvcMemoryService, conversation_of
from memsvc_client.integrations.langchain import MemsvcRetriever
from memsvc_client.integrations.llama_index import MemsvcMemoryBlock

from .test_client import WRITER, ServerTestCase
from .test_google_adk import said, session_with

FACT = "My sister Wenjing keeps bees on the roof of her flat in Chengdu."
# 5,400 characters of earlier talk, then the question the memory answers
LONG = "We went over the quarterly figures and the budget again, " * 95 + (
    "Anyway, where does my sister keep her bees?"
)


class LongQueryTest(ServerTestCase):
    def write(self, conversation: str) -> None:
        with MemoryClient(self.target, token=WRITER) as client:
            event = pb.MemoryEvent(conversation_id=conversation, speaker="user", text=FACT)
            client.append([event], assign_turn_ids=True, wait=True)

    def test_langchain_retriever_finds_what_the_end_asks(self) -> None:
        self.write("long-lc")
        with MemoryClient(self.target, token=WRITER) as client:
            docs = MemsvcRetriever(client=client, conversation_ids=["long-lc"]).invoke(LONG)
        self.assertIn("bees", " ".join(d.page_content for d in docs))

    def test_llama_index_aget_finds_what_the_end_asks(self) -> None:
        self.write("long-li")
        block = MemsvcMemoryBlock(target=self.target, token=WRITER, conversation_id="long-li")
        text = asyncio.run(block.aget([ChatMessage(role=MessageRole.USER, content=LONG)]))
        self.assertIn("bees", text)

    def test_adk_search_memory_finds_what_the_end_asks(self) -> None:
        async def flow() -> str:
            memory = MemsvcMemoryService(self.target, token=WRITER)
            try:
                _, session = await session_with([said("user", FACT)], "long-app", "u1")
                await memory.add_session_to_memory(session)
                with MemoryClient(self.target, token=WRITER) as client:
                    conversation = conversation_of("long-app", "u1")
                    last = client.export(conversation)[-1].turn_id
                    self.assertTrue(client.wait_for_indexed(conversation, last).indexed)
                found = await memory.search_memory(app_name="long-app", user_id="u1", query=LONG)
                return " ".join(
                    part.text or "" for m in found.memories for part in (m.content.parts or [])
                )
            finally:
                await memory.close()

        self.assertIn("bees", asyncio.run(flow()))
