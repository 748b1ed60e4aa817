"""The asyncio client and the LangChain adapters against a real memsvc, with the real
langchain-core (installed by the `langchain` extra in the client's own venv)."""

from __future__ import annotations

import asyncio

import grpc
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from memsvc_client import AsyncMemoryClient, MemoryClient, MemsvcError, RefusedEvents
from memsvc_client.integrations.langchain import MemsvcChatMessageHistory, MemsvcRetriever

from .test_client import (
    READER,
    WRITER,
    ServerTestCase,
    check_writers_kept,
    run_readme_snippet,
    run_writers,
    turn,
)


class AsyncClientTest(ServerTestCase):
    def test_the_same_calls_and_errors_over_grpc_aio(self) -> None:
        async def flow() -> None:
            async with AsyncMemoryClient(self.target, token=WRITER) as memory:
                events = [turn("aio-1", 0, "My locker code at the gym is 4417.")]
                reply = await memory.append(events, wait=True)
                self.assertEqual(reply.accepted, 1)
                hits = await memory.search("gym locker code", conversation_ids=["aio-1"])
                self.assertIn("4417", hits[0].text)
                self.assertEqual([e.text for e in await memory.export("aio-1")], [events[0].text])
            async with AsyncMemoryClient(self.target, token=READER) as reader:
                with self.assertRaises(MemsvcError) as denied:
                    await reader.append([turn("aio-1", 1, "no")])
                self.assertEqual(denied.exception.code, grpc.StatusCode.PERMISSION_DENIED)
                self.assertEqual(denied.exception.reason, "ROLE_TOO_LOW")

        asyncio.run(flow())


class LangChainTest(ServerTestCase):
    def test_two_processes_share_one_history_and_lose_nothing(self) -> None:
        writer = (
            "import sys\n"
            "from langchain_core.messages import AIMessage, HumanMessage\n"
            "from memsvc_client import MemoryClient\n"
            "from memsvc_client.integrations.langchain import MemsvcChatMessageHistory\n"
            "with MemoryClient(sys.argv[1], token=sys.argv[2]) as client:\n"
            "    history, name = MemsvcChatMessageHistory('lc-shared', client), sys.argv[3]\n"
            "    for i in range(15):\n"
            "        pair = [HumanMessage(f'{name} {i}'), AIMessage(f'{name} ok {i}')]\n"
            "        history.add_messages(pair)\n"
        )
        run_writers(writer, self.target)
        with MemoryClient(self.target, token=WRITER) as client:
            said = [str(m.content) for m in MemsvcChatMessageHistory("lc-shared", client).messages]
        check_writers_kept(self, said, 15)

    def test_a_refused_message_raises_naming_the_field_and_a_huge_one_is_kept(self) -> None:
        # issue 63, item 2: add_messages never read AppendEventsResponse.errors; a message
        # memsvc refused was dropped silently with the call's other messages. Now it raises,
        # naming the field; a 1.2M-character tool output (under the payload limit) is kept
        # whole, as the in-memory history keeps it (a larger one in parts: test_large_items).
        huge = "log line 42 ok\n" * 80_000  # 1.2M characters
        too_long_name = "n" * 300  # over memsvc's 256-character speaker names
        with MemoryClient(self.target, token=WRITER) as client:
            history = MemsvcChatMessageHistory("lc-limits", client)
            with self.assertRaises(RefusedEvents) as refused:
                history.add_messages(
                    [HumanMessage("a short one"), HumanMessage("hi", name=too_long_name)]
                )
            self.assertIn("events[1].speaker_name", str(refused.exception))
            self.assertIsInstance(refused.exception, ValueError)
            self.assertEqual(history.messages, [])  # nothing half-written
            kept = [HumanMessage("dump the log"), ToolMessage(huge, tool_call_id="t1")]
            history.add_messages(kept)
            self.assertEqual(history.messages, kept)

            async def refused_async() -> str:
                async with AsyncMemoryClient(self.target, token=WRITER) as aclient:
                    async_history = MemsvcChatMessageHistory("lc-limits-a", async_client=aclient)
                    try:
                        await async_history.aadd_messages([HumanMessage("hi", name=too_long_name)])
                    except RefusedEvents as exc:
                        return str(exc)
                    return ""

            self.assertIn("speaker_name", asyncio.run(refused_async()))

    def test_chat_history_round_trip_from_two_writers(self) -> None:
        with MemoryClient(self.target, token=WRITER) as client:
            one = MemsvcChatMessageHistory("lc-1", client, wait=True)
            two = MemsvcChatMessageHistory("lc-1", client)  # another process, same session
            one.add_messages(
                [
                    SystemMessage(content="You are a travel assistant."),
                    HumanMessage(content="I want to visit Kyoto in April.", name="Mei"),
                ]
            )
            two.add_message(AIMessage(content="April is cherry blossom season in Kyoto."))
            messages = one.messages
            self.assertEqual(
                [(type(m), m.content) for m in messages],
                [
                    (SystemMessage, "You are a travel assistant."),
                    (HumanMessage, "I want to visit Kyoto in April."),
                    (AIMessage, "April is cherry blossom season in Kyoto."),
                ],
            )
            self.assertEqual(messages[1].name, "Mei")
            one.clear()
            self.assertEqual(one.messages, [])
            one.add_user_message("A new start after clear.")
            self.assertEqual([m.content for m in one.messages], ["A new start after clear."])

    def test_tool_calls_and_content_blocks_round_trip_exactly(self) -> None:
        sent = [
            HumanMessage(
                content=[{"type": "text", "text": "What's the weather in Kyoto? 京都"}],
                id="m1",
            ),
            AIMessage(
                content="",
                tool_calls=[{"name": "weather", "args": {"city": "Kyoto"}, "id": "call_1"}],
                id="m2",
            ),
            ToolMessage(content="18°C, light rain", tool_call_id="call_1", name="weather"),
            AIMessage(content="18°C and light rain in Kyoto.", response_metadata={"m": 1}),
        ]
        with MemoryClient(self.target, token=WRITER) as client:
            history = MemsvcChatMessageHistory("lc-tools", client, wait=True)
            history.add_messages(sent)
            self.assertEqual(history.messages, sent)
            said = [(e.speaker, e.text) for e in client.export("lc-tools")]
            self.assertEqual(
                said,
                [
                    ("user", "What's the weather in Kyoto? 京都"),
                    ("assistant", 'weather {"city": "Kyoto"}'),
                    ("system", "18°C, light rain"),
                    ("assistant", "18°C and light rain in Kyoto."),
                ],
            )
            hits = client.search("Kyoto weather rain", conversation_ids=["lc-tools"])
            self.assertIn("light rain", hits[0].text)

    def test_async_history_and_retriever(self) -> None:
        async def flow() -> None:
            async with AsyncMemoryClient(self.target, token=WRITER) as aclient:
                history = MemsvcChatMessageHistory("lc-2", async_client=aclient, wait=True)
                await history.aadd_messages(
                    [
                        HumanMessage(content="My daughter is allergic to peanuts."),
                        AIMessage(content="Noted: no peanuts in her recipes."),
                    ]
                )
                got = await history.aget_messages()
                self.assertEqual([type(m) for m in got], [HumanMessage, AIMessage])
                retriever = MemsvcRetriever(async_client=aclient, conversation_ids=["lc-2"])
                docs = await retriever.ainvoke("food allergy")
                self.assertIsInstance(docs[0], Document)
                self.assertIn("peanuts", docs[0].page_content)
                meta = docs[0].metadata
                self.assertEqual(meta["conversation_id"], "lc-2")
                self.assertEqual((meta["turn_start"], meta["turn_end"]), (0, 1))
                self.assertIn("user", meta["speakers"])
                self.assertGreater(meta["score"], 0)

        asyncio.run(flow())
        with MemoryClient(self.target, token=READER) as client:
            docs = MemsvcRetriever(client=client, conversation_ids=["lc-2"], top_k=1).invoke(
                "peanut allergy"
            )
            self.assertEqual(len(docs), 1)
            self.assertIn("peanuts", docs[0].page_content)


class LangChainReadmeSnippetTest(ServerTestCase):
    def test_the_readme_snippet_runs(self) -> None:
        scope = run_readme_snippet("integrations.langchain", self.target, WRITER)
        docs = scope["docs"]
        assert isinstance(docs, list)
        self.assertIn("Miso", docs[0].page_content)
        self.assertEqual(docs[0].metadata["conversation_id"], "user-7")
