"""LangChain's own retriever cases against `MemsvcRetriever`, with a sync and an async client:
the logic of langchain-tests' `RetrieversIntegrationTests`
(libs/standard-tests/langchain_tests/integration_tests/retrievers.py: test_k_constructor_param,
test_invoke_with_k_kwarg, test_invoke_returns_documents, test_ainvoke_returns_documents),
rewritten here rather than vendored, against a real memsvc and the real langchain-core.

Also what made 4 of those 5 fail with an async client (issue 63, item 5): an
`AsyncMemoryClient` made outside a running loop raised RuntimeError, and one reused in a
second `asyncio.run` failed with "Event loop is closed". And the history's async methods on
one client across loops."""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.documents import Document
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.retrievers import BaseRetriever
from memsvc_client import AsyncMemoryClient, MemoryClient, pb
from memsvc_client.integrations.langchain import MemsvcChatMessageHistory, MemsvcRetriever

from .test_client import WRITER, ServerTestCase

CONVERSATION = "lc-standard"
QUERY = "hiking trails near the lake"
PLACES = ["Emerald Bay", "Eagle Falls", "Cascade Lake", "Fallen Leaf", "Mount Tallac"]


class RetrieverStandardCases:
    """The upstream cases (a mixin: each test class below gives `make_retriever`)."""

    target: str

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()  # type: ignore[misc]
        turns = []
        for i, place in enumerate(PLACES):
            turns += [
                f"Last weekend I hiked the {place} trail near the lake, about {i + 4} miles.",
                f"The {place} trail by the lake sounds lovely for a hike.",
                f"I also cooked dinner number {i} and watched a film about space.",
                "Fine, tell me more another day.",
            ]
        events = [
            pb.MemoryEvent(
                conversation_id=CONVERSATION,
                speaker="user" if i % 2 == 0 else "assistant",
                text=text,
            )
            for i, text in enumerate(turns)
        ]
        with MemoryClient(cls.target, token=WRITER) as client:
            if not client.export(CONVERSATION, last=1):  # once per server: the classes share it
                client.append(events, assign_turn_ids=True, wait=True)

    def make_retriever(self, **params: Any) -> BaseRetriever:
        raise NotImplementedError

    def invoke(self, retriever: BaseRetriever, **kwargs: Any) -> list[Document]:
        return retriever.invoke(QUERY, **kwargs)

    def test_k_constructor_param(self) -> None:
        for k in (3, 1):
            result = self.invoke(self.make_retriever(k=k))
            self.assertEqual(len(result), k)
            self.assertTrue(all(isinstance(doc, Document) for doc in result))

    def test_invoke_with_k_kwarg(self) -> None:
        retriever = self.make_retriever()
        for k in (1, 3):
            result = self.invoke(retriever, k=k)
            self.assertEqual(len(result), k)
            self.assertTrue(all(isinstance(doc, Document) for doc in result))

    def test_invoke_returns_documents(self) -> None:
        result = self.invoke(self.make_retriever())
        self.assertTrue(result)
        self.assertTrue(all(isinstance(doc, Document) for doc in result))
        self.assertIn("trail", result[0].page_content)

    def test_ainvoke_returns_documents(self) -> None:
        retriever = self.make_retriever()
        result = asyncio.run(retriever.ainvoke(QUERY))
        self.assertTrue(result)
        self.assertTrue(all(isinstance(doc, Document) for doc in result))


class SyncClientRetrieverTest(RetrieverStandardCases, ServerTestCase):
    def make_retriever(self, **params: Any) -> BaseRetriever:
        client = MemoryClient(self.target, token=WRITER)
        self.addCleanup(client.close)
        return MemsvcRetriever(client=client, conversation_ids=[CONVERSATION], **params)


class AsyncClientRetrieverTest(RetrieverStandardCases, ServerTestCase):
    """An async client made here, outside any loop, and each call on a loop of its own
    (every asyncio.run), as the upstream suite and LangChain apps use it."""

    def make_retriever(self, **params: Any) -> BaseRetriever:
        client = AsyncMemoryClient(self.target, token=WRITER)
        return MemsvcRetriever(async_client=client, conversation_ids=[CONVERSATION], **params)

    def invoke(self, retriever: BaseRetriever, **kwargs: Any) -> list[Document]:
        return asyncio.run(retriever.ainvoke(QUERY, **kwargs))

    def test_one_history_across_event_loops(self) -> None:
        client = AsyncMemoryClient(self.target, token=WRITER)  # no loop runs yet
        history = MemsvcChatMessageHistory("lc-loops", async_client=client)
        asyncio.run(history.aadd_messages([HumanMessage("first loop")]))
        asyncio.run(history.aadd_messages([AIMessage("second loop")]))
        said = asyncio.run(history.aget_messages())
        self.assertEqual([m.content for m in said], ["first loop", "second loop"])
