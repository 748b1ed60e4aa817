"""An item over memsvc's 3,000,000-character payload, in every adapter (issue 83, item 3).

On v0.x each was refused: the Agents SDK's `add_items` with a 3.2M-character image data
URL kept 0 items; LlamaIndex's `Memory` had archived a flushed 2.4 MB `ImageBlock` message
and the one after it when the put was refused (both lost); ADK refused a session holding a
2.4 MB `inline_data` event on every add, so none of its events was kept. Now such an item
is kept in parts (`memsvc_client.integrations._parts`) and read back exactly, its
neighbours with it; a pop, a limit and a delete take it as one item; a read that cuts it
leaves it out; an add larger than one request is written in several, and one refused
part-way leaves nothing behind. Against a real memsvc."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import unittest

from google.adk.events import Event
from google.genai import types
from langchain_core.messages import AIMessage, HumanMessage
from llama_index.core.base.llms.types import ChatMessage, ImageBlock, MessageRole, TextBlock
from memsvc_client import MemoryClient, pb
from memsvc_client.client import new_idempotency_key
from memsvc_client.integrations import _parts
from memsvc_client.integrations.google_adk import MemsvcMemoryService, conversation_of
from memsvc_client.integrations.langchain import MemsvcChatMessageHistory
from memsvc_client.integrations.llama_index import MemsvcMemoryBlock
from memsvc_client.integrations.openai_agents import MemsvcSession

from .test_client import WRITER, ServerTestCase
from .test_google_adk import session_with
from .test_llama_index import memory

IMAGE = os.urandom(2_400_000)  # 3.2M characters of base64: over the payload limit
DATA_URL = "data:image/png;base64," + base64.b64encode(IMAGE).decode()


def image_item(caption: str) -> dict[str, object]:
    return {
        "role": "user",
        "content": [
            {"type": "input_text", "text": caption},
            {"type": "input_image", "image_url": DATA_URL, "detail": "auto"},
        ],
    }


class AgentsSdkTest(ServerTestCase):
    def test_an_image_item_round_trips_and_pops_as_one_item(self) -> None:
        items: list[dict[str, object]] = [
            {"role": "user", "content": "I renewed my passport today."},
            image_item("the new passport's photo page"),
            {"role": "assistant", "content": "Noted: the passport is renewed."},
        ]

        async def flow() -> None:
            session = MemsvcSession("large-agents", self.target, token=WRITER)
            await session.add_items(items)  # type: ignore[arg-type]
            self.assertEqual(await session.get_items(), items)
            self.assertEqual(await session.get_items(limit=2), items[1:])  # counts it once
            self.assertEqual(await session.pop_item(), items[2])
            self.assertEqual(await session.pop_item(), items[1])  # every part of it
            self.assertEqual(await session.get_items(), items[:1])
            await session.close()

        asyncio.run(flow())
        with MemoryClient(self.target, token=WRITER) as client:
            self.assertEqual(len(client.export("large-agents")), 1)  # no part left behind


class LlamaIndexTest(ServerTestCase):
    def test_a_flushed_image_message_and_the_next_are_kept(self) -> None:
        block = MemsvcMemoryBlock(target=self.target, token=WRITER)
        photo = ChatMessage(
            role=MessageRole.USER,
            blocks=[TextBlock(text="my locker's photo"), ImageBlock(image=IMAGE)],
        )
        after = ChatMessage(role=MessageRole.ASSISTANT, content="Locker 212, photo kept.")
        words = [ChatMessage(role=MessageRole.USER, content=f"filler {i} " * 10) for i in range(6)]

        async def flow() -> list[ChatMessage]:
            mem = memory("large-llama", block)
            await mem.aput_messages([photo, after, *words])  # over its budget: flushed
            return await block.messages(session_id="large-llama")

        kept = asyncio.run(flow())
        self.assertGreater(len(photo.model_dump_json()), _parts.MAX_PAYLOAD_CHARS)
        self.assertEqual(kept[:2], [photo, after])


class LangChainTest(ServerTestCase):
    def test_a_message_larger_than_one_request_round_trips(self) -> None:
        # 13.4M characters: fourteen parts, in two requests (each under 16 MiB)
        huge = HumanMessage(content=[{"type": "text", "text": "scan"}, "x" * 13_400_000])
        reply = AIMessage(content="Got the scan.")
        with MemoryClient(self.target, token=WRITER) as client:
            history = MemsvcChatMessageHistory("large-lc", client)
            history.add_messages([huge, reply])
            self.assertEqual(history.messages, [huge, reply])


class AdkTest(ServerTestCase):
    def test_a_session_with_a_large_inline_image_is_kept_found_and_deleted(self) -> None:
        blob = types.Blob(mime_type="image/png", data=IMAGE, display_name="passport.png")
        events = [
            Event(author="user", content=types.Content(role="user", parts=[types.Part(text="hi")])),
            Event(
                author="user",
                content=types.Content(
                    role="user",
                    parts=[types.Part(text="my passport photo page"), types.Part(inline_data=blob)],
                ),
            ),
            Event(
                author="coach",
                content=types.Content(role="model", parts=[types.Part(text="Photo kept.")]),
            ),
        ]
        conversation = conversation_of("large-app", "u1")

        async def flow() -> None:
            _, session = await session_with(events, "large-app", "u1")
            service = MemsvcMemoryService(self.target, token=WRITER, min_similarity=None)
            await service.add_session_to_memory(session)
            await service.add_session_to_memory(session)  # again: nothing added twice
            kept = await service.events(app_name="large-app", user_id="u1")
            self.assertEqual(kept, session.events)
            found = await service.search_memory(
                app_name="large-app", user_id="u1", query="passport photo page"
            )
            image = next(m for m in found.memories if m.id == session.events[1].id)
            self.assertEqual(image.content.parts[1].inline_data, blob)  # whole
            await service.delete_memory(
                app_name="large-app", user_id="u1", memory_id=session.events[1].id
            )
            await service.add_session_to_memory(session)  # a deleted event is not added back
            kept = await service.events(app_name="large-app", user_id="u1")
            self.assertEqual([e.id for e in kept], [session.events[0].id, session.events[2].id])
            await service.close()

        asyncio.run(flow())
        with MemoryClient(self.target, token=WRITER) as client:
            self.assertEqual(len(client.export(conversation)), 2)  # every part deleted


class PartsTest(ServerTestCase):
    def big_turns(self, conversation: str) -> list[pb.MemoryEvent]:
        payload = json.dumps({"data": "y" * 13_000_000})
        event = pb.MemoryEvent(
            conversation_id=conversation, speaker="user", text="big", payload=payload
        )
        return _parts.split(event, "item-1")

    def test_an_add_refused_part_way_leaves_nothing(self) -> None:
        turns = self.big_turns("large-refused")
        bad = pb.MemoryEvent(conversation_id="large-refused", speaker="robot", text="x")
        plan = _parts.appended("large-refused", [*turns, bad], new_idempotency_key())
        self.assertGreater(len(_parts.requests([*turns, bad])), 1)
        with MemoryClient(self.target, token=WRITER) as client:
            reply = _parts.run(client, plan)
            self.assertIn("speaker", reply.errors[0].message)
            self.assertEqual(client.export("large-refused"), [])  # the first request undone

    def test_a_read_that_cuts_an_item_leaves_it_out(self) -> None:
        turns = self.big_turns("large-cut")
        for turn_id, turn in enumerate(turns):
            turn.turn_id = turn_id
        whole = _parts.items(turns)
        self.assertEqual(len(whole), 1)
        self.assertEqual(whole[0].turn_ids, tuple(range(len(turns))))
        self.assertEqual(json.loads(whole[0].turn.payload)["data"], "y" * 13_000_000)
        self.assertEqual(_parts.item_id(turns[0]), "item-1")
        self.assertEqual(_parts.items(turns[1:]), [])  # its head cut off
        self.assertEqual(_parts.items(turns[:-1]), [])  # its tail cut off
        altered = [*turns]
        altered[1] = pb.MemoryEvent(turn_id=1, payload=turns[1].payload.replace("y", "z", 1))
        self.assertEqual(_parts.items(altered), [])  # its digest no longer matches


if __name__ == "__main__":
    unittest.main()
