"""A turn another client wrote, read by each adapter (issue 83, item 7): reading one crashed
LangChain (`KeyError: 'type'`, the whole read failed), and LlamaIndex `messages()` and ADK
`events()` had no guard. Each adapter reads a conversation holding turns of other shapes
(another adapter's JSON, a JSON list, text that is not JSON, plain text with no payload):
the foreign payloads are skipped, a plain turn reads as text (ADK keeps only its events),
and nothing raises. The rule is the integrations page's; the Agents SDK adapter has it."""

from __future__ import annotations

import asyncio

from memsvc_client import MemoryClient, pb
from memsvc_client.integrations.google_adk import MemsvcMemoryService, conversation_of
from memsvc_client.integrations.langchain import MemsvcChatMessageHistory
from memsvc_client.integrations.llama_index import MemsvcMemoryBlock

from .test_client import WRITER, ServerTestCase

FOREIGN = [
    '{"role": "user", "content": "from the Agents SDK"}',  # an object, not this framework's
    "[1, 2, 3]",
    "not json at all",
]


def foreign_turns(conversation: str) -> list[pb.MemoryEvent]:
    turns = [
        pb.MemoryEvent(conversation_id=conversation, speaker="user", text=f"x {i}", payload=p)
        for i, p in enumerate(FOREIGN)
    ]
    plain = pb.MemoryEvent(conversation_id=conversation, speaker="user", text="plain words")
    return [*turns, plain]


class ForeignTurnsTest(ServerTestCase):
    def write(self, conversation: str) -> None:
        with MemoryClient(self.target, token=WRITER) as client:
            client.append(foreign_turns(conversation), assign_turn_ids=True, wait=True)

    def test_langchain_skips_them(self) -> None:
        self.write("foreign-lc")
        with MemoryClient(self.target, token=WRITER) as client:
            messages = MemsvcChatMessageHistory("foreign-lc", client).messages
        self.assertEqual([m.content for m in messages], ["plain words"])

    def test_llama_index_skips_them(self) -> None:
        self.write("foreign-li")
        block = MemsvcMemoryBlock(target=self.target, token=WRITER, conversation_id="foreign-li")
        messages = asyncio.run(block.messages())
        # the Agents SDK's message item is a ChatMessage's shape too: it reads as one
        self.assertEqual([m.content for m in messages], ["from the Agents SDK", "plain words"])

    def test_adk_skips_them_in_events_and_search(self) -> None:
        self.write(conversation_of("foreign-app", "u1"))

        async def flow() -> tuple[int, int]:
            memory = MemsvcMemoryService(self.target, token=WRITER, min_similarity=None)
            try:
                events = await memory.events(app_name="foreign-app", user_id="u1")
                found = await memory.search_memory(
                    app_name="foreign-app", user_id="u1", query="Agents SDK words"
                )
                return len(events), len(found.memories)
            finally:
                await memory.close()

        self.assertEqual(asyncio.run(flow()), (0, 0))


class InjectiveSessionsTest(ServerTestCase):
    """Issue 83, item 2: session ids went through raw and the server folds them, so
    "x  y" and "x y", "id " and "id", NFD and NFC café read each other's items (as
    SQLiteSession keeps them apart, so must these adapters)."""

    PAIRS = (("inj x  y", "inj x y"), ("inj-id ", "inj-id"), ("inj-cafe\u0301", "inj-caf\u00e9"))

    def test_langchain_and_the_agents_sdk_keep_them_apart(self) -> None:
        from langchain_core.messages import HumanMessage
        from memsvc_client.integrations.openai_agents import MemsvcSession

        with MemoryClient(self.target, token=WRITER) as client:
            for a, b in self.PAIRS:
                MemsvcChatMessageHistory(f"lc {a}", client).add_messages([HumanMessage("A")])
                other = MemsvcChatMessageHistory(f"lc {b}", client)
                self.assertEqual(other.messages, [], (a, b))

        async def agents() -> None:
            for a, b in self.PAIRS:
                one = MemsvcSession(f"ag {a}", self.target, token=WRITER)
                other = MemsvcSession(f"ag {b}", self.target, token=WRITER)
                await one.add_items([{"role": "user", "content": "A"}])
                self.assertEqual(await other.get_items(), [], (a, b))
                await one.close()
                await other.close()

        asyncio.run(agents())

    def test_a_normal_id_stays_as_it_is(self) -> None:
        from memsvc_client.integrations._ids import single_id

        self.assertEqual(single_id("acme/u1/s1"), "acme/u1/s1")  # a tenant's prefix stays
        self.assertEqual(single_id("x  y"), "x%20%20y")
        self.assertEqual(single_id("100%"), "100%25")
