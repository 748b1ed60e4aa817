"""memsvc as a LlamaIndex memory block, against a real memsvc and the real installed
`llama-index-core` (the `llama-index` extra in the client's venv): a `Memory` flushes its
oldest messages into the block, they come back exactly, what memsvc finds for the latest
messages is inserted into the prompt, and cleared turns stay gone.

The `Memory` counts tokens with a whitespace split (its default tokenizer downloads
tiktoken's vocabulary, which an offline machine cannot)."""

from __future__ import annotations

import asyncio

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.memory import Memory
from llama_index.core.prompts import RichPromptTemplate
from memsvc_client import MemoryClient
from memsvc_client.integrations.llama_index import MemsvcMemoryBlock

from .test_client import (
    ADMIN,
    WRITER,
    ServerTestCase,
    check_writers_kept,
    run_readme_snippet,
    run_writers,
)

CHAT = [
    ("user", "Hi! I just joined the climbing gym on Harbour Street."),
    ("assistant", "Nice! How often do you plan to go?"),
    ("user", "Three times a week. My locker there is number 212 and its code is 4417."),
    ("assistant", "Noted: locker 212, code 4417."),
    ("user", "I also need to buy chalk and a new harness before Saturday."),
    ("assistant", "Chalk and a harness before Saturday, got it."),
    ("user", "My sister Lena might join me on Sundays."),
    ("assistant", "Climbing with Lena on Sundays sounds fun."),
]


def memory(session_id: str, block: MemsvcMemoryBlock) -> Memory:
    return Memory.from_defaults(
        session_id=session_id,
        token_limit=60,
        chat_history_token_ratio=0.5,
        token_flush_size=20,
        tokenizer_fn=lambda text: text.split(),
        memory_blocks=[block],
    )


def chat_messages() -> list[ChatMessage]:
    messages = [ChatMessage(role=MessageRole(role), content=text) for role, text in CHAT]
    # what a framework may attach: kept exactly, never searched
    messages[3].additional_kwargs["tool_calls"] = [{"id": "c1", "name": "note", "args": "{}"}]
    return messages


class MemoryBlockTest(ServerTestCase):
    def block(self, **kw: object) -> MemsvcMemoryBlock:
        return MemsvcMemoryBlock(target=self.target, token=WRITER, **kw)  # type: ignore[arg-type]

    def wait_indexed(self, conversation_id: str) -> None:
        with MemoryClient(self.target, token=WRITER) as client:
            events = client.export(conversation_id)
            self.assertTrue(client.wait_for_indexed(conversation_id, events[-1].turn_id).indexed)

    def test_flushed_messages_are_turns_that_come_back_exactly(self) -> None:
        async def run() -> tuple[list[ChatMessage], list[ChatMessage]]:
            block = self.block()
            mem = memory("li-exact", block)
            for message in chat_messages():
                await mem.aput(message)
            kept = await block.messages("li-exact")
            short_term = await mem.aget_all()
            await block.close()
            return kept, short_term

        kept, everything = asyncio.run(run())
        # the Memory flushed its oldest messages into the block, and kept every one itself
        self.assertTrue(0 < len(kept) < len(CHAT))
        self.assertEqual(kept, chat_messages()[: len(kept)])
        self.assertEqual(everything, chat_messages())
        self.assertNotIn("session_id", kept[0].additional_kwargs)
        with MemoryClient(self.target, token=WRITER) as client:
            turns = client.export("li-exact")
        self.assertEqual([t.speaker for t in turns], [role for role, _ in CHAT][: len(turns)])
        self.assertEqual([t.text for t in turns], [text for _, text in CHAT][: len(turns)])

    def test_what_memsvc_finds_is_inserted_into_the_prompt(self) -> None:
        async def fill() -> None:
            mem = memory("li-recall", self.block())
            for message in chat_messages():
                await mem.aput(message)

        asyncio.run(fill())
        self.wait_indexed("li-recall")

        async def ask() -> list[ChatMessage]:
            block = self.block()
            mem = memory("li-recall", block)  # a new process's Memory: nothing short-term
            await mem.aput(ChatMessage(role=MessageRole.USER, content="What is my locker code?"))
            prompt = await mem.aget()
            await block.close()
            return prompt

        prompt = asyncio.run(ask())
        system = prompt[0]
        self.assertEqual(system.role, MessageRole.SYSTEM)
        self.assertIn("<memsvc>", system.content or "")
        self.assertIn("4417", system.content or "")
        self.assertEqual(prompt[-1].content, "What is my locker code?")

    def test_a_put_is_found_by_the_next_get(self) -> None:
        # issue 63, item 7: aput then aget gave '' (nothing searchable yet); the block waits
        # by default, as an in-memory block shows a message at once
        async def run() -> str:
            block = self.block(conversation_id="li-ryw")
            await block.aput(
                [ChatMessage(role=MessageRole.USER, content="My bike lock code is 6081.")]
            )
            found = await block.aget([ChatMessage(role=MessageRole.USER, content="bike lock code")])
            await block.close()
            return found

        self.assertIn("6081", asyncio.run(run()))

    def test_vector_memory_block_cases(self) -> None:
        # llama-index-core's tests/memory/blocks/test_vector.py (VectorMemoryBlock):
        # test_vector_memory_block_get, test_empty_messages, test_retrieval_context_window,
        # test_format_template. Also there: _put (here test_flushed_messages_are_turns_...),
        # test_message_without_text (here test_a_message_with_nothing_to_remember_...).
        # Not applicable: test_node_postprocessors (memsvc returns hits, not LlamaIndex
        # nodes; what a hit says is the server's chunk).
        history = [
            ChatMessage(role=MessageRole.USER, content="What's the capital of France?"),
            ChatMessage(role=MessageRole.ASSISTANT, content="The capital of France is Paris."),
            ChatMessage(role=MessageRole.USER, content="What about Germany?"),
            ChatMessage(role=MessageRole.ASSISTANT, content="The capital of Germany is Berlin."),
        ]

        async def run() -> tuple[str, str, list[ChatMessage], str, str]:
            block = self.block(conversation_id="li-vector")
            empty = await block.aget(messages=[])
            await block.aput(messages=[])
            nothing = await block.messages("li-vector")
            await block.aput(messages=history)
            paris = await block.aget(
                messages=[ChatMessage(role=MessageRole.USER, content="Tell me about Paris.")]
            )
            windowed = self.block(conversation_id="li-vector", retrieval_context_window=2)
            germany = await windowed.aget(
                messages=[
                    ChatMessage(role=MessageRole.USER, content="What about the UK?"),
                    ChatMessage(role=MessageRole.ASSISTANT, content="The UK's is London."),
                    ChatMessage(role=MessageRole.USER, content="And Germany?"),
                ]
            )
            templated = self.block(
                conversation_id="li-vector",
                format_template=RichPromptTemplate("Relevant context: {{ text }}"),
            )
            custom = await templated.aget(
                messages=[ChatMessage(role=MessageRole.USER, content="Tell me about Paris.")]
            )
            for b in (block, windowed, templated):
                await b.close()
            return empty, paris, nothing, germany, custom

        empty, paris, nothing, germany, custom = asyncio.run(run())
        self.assertEqual((empty, nothing), ("", []))
        self.assertIn("capital of France is Paris", paris)
        self.assertIn("Berlin", germany)
        self.assertTrue(custom.startswith("Relevant context:"))
        self.assertIn("capital of France is Paris", custom)

    def test_a_message_with_nothing_to_remember_is_not_stored(self) -> None:
        # issue 63, item 9: an empty message was stored as a "[user]" turn; VectorMemoryBlock
        # stores nothing for it
        async def run() -> list[ChatMessage]:
            block = self.block(conversation_id="li-empty", wait=False)
            await block.aput(
                [
                    ChatMessage(role=MessageRole.USER, content=""),
                    ChatMessage(role=MessageRole.ASSISTANT, content="Noted."),
                ]
            )
            kept = await block.messages("li-empty")
            await block.close()
            return kept

        self.assertEqual([m.content for m in asyncio.run(run())], ["Noted."])

    def test_a_conversation_id_overrides_the_session_and_clear_stays_cleared(self) -> None:
        async def run() -> tuple[str, list[ChatMessage], str]:
            block = self.block(conversation_id="li-shared")
            mem = memory("any-session", block)
            for message in chat_messages():
                await mem.aput(message)
            with MemoryClient(self.target, token=WRITER) as client:
                events = client.export("li-shared")
                client.wait_for_indexed("li-shared", events[-1].turn_id)
            query = [ChatMessage(role=MessageRole.USER, content="what is my locker code?")]
            before = await block.aget(query)
            await block.clear()
            after = await block.aget(query)
            kept = await block.messages()
            await block.close()
            return before, kept, after

        before, kept, after = asyncio.run(run())
        self.assertIn("4417", before)
        self.assertEqual((kept, after), ([], ""))
        purger = MemsvcMemoryBlock(target=self.target, token=ADMIN, conversation_id="li-shared")
        erased = asyncio.run(purger.purge())
        self.assertGreater(erased.events_purged, 0)

    def test_two_processes_share_one_conversation_and_lose_nothing(self) -> None:
        writer = (
            "import asyncio, sys\n"
            "from llama_index.core.base.llms.types import ChatMessage\n"
            "from memsvc_client.integrations.llama_index import MemsvcMemoryBlock\n"
            "async def main():\n"
            "    block = MemsvcMemoryBlock(target=sys.argv[1], token=sys.argv[2],\n"
            "                              conversation_id='li-shared')\n"
            "    name = sys.argv[3]\n"
            "    for i in range(15):\n"
            "        await block.aput([ChatMessage(role='user', content=f'{name} {i}'),\n"
            "                          ChatMessage(role='assistant', content=f'{name} ok {i}')])\n"
            "    await block.close()\n"
            "asyncio.run(main())\n"
        )
        run_writers(writer, self.target)

        async def read() -> list[str]:
            block = self.block(conversation_id="li-shared")
            try:
                return [str(m.content) for m in await block.messages()]
            finally:
                await block.close()

        check_writers_kept(self, asyncio.run(read()), 15)

    def test_a_refused_put_raises_and_writes_nothing(self) -> None:
        block = self.block(conversation_id=" ")  # not a conversation id memsvc accepts

        async def put() -> None:
            await block.aput([ChatMessage(role=MessageRole.USER, content="hello")])

        with self.assertRaisesRegex(ValueError, "memsvc refused the messages"):
            asyncio.run(put())

    def test_similarity_top_k_is_the_number_of_hits(self) -> None:
        # issue 83, item 8: VectorMemoryBlock's similarity_top_k was accepted and ignored
        # (top_k stayed 5), so a block swapped in for it returned more than asked
        # each put long enough to be a chunk of its own: three hits to choose from
        facts = [
            f"Locker {n} holds the {colour} rope. "
            + " ".join(f"note {colour} {i}." for i in range(90))
            for n, colour in enumerate("red blue green".split())
        ]

        async def run() -> tuple[int, str, str]:
            block = self.block(conversation_id="li-topk", similarity_top_k=1)
            # one message a put: each is a turn of its own window of the conversation
            for fact in facts:
                await block.aput([ChatMessage(role=MessageRole.USER, content=fact)])
            found = await block.aget([ChatMessage(role=MessageRole.USER, content="rope locker")])
            wide = self.block(conversation_id="li-topk", similarity_top_k=3)
            three = await wide.aget([ChatMessage(role=MessageRole.USER, content="rope locker")])
            for b in (block, wide):
                await b.close()
            return block.top_k, found, three

        top_k, found, three = asyncio.run(run())
        self.assertEqual(top_k, 1)
        self.assertEqual(found.count("\n- "), 1, found)
        self.assertGreater(three.count("\n- "), 1, three)

    def test_a_chinese_context_line_stays_out_of_the_prompt(self) -> None:
        # issue 83, item 8: only "[Context:" was stripped; a Chinese chunk's
        # "[上下文：…]" line reached the prompt beside the block's own day and speakers
        said = ["我的护照是2025年2月18日过期。", "好的，我记下了护照的日期。"]

        async def run() -> str:
            block = self.block(conversation_id="li-zh")
            await block.aput(
                [
                    ChatMessage(role=MessageRole(role), content=text)
                    for role, text in zip(("user", "assistant"), said, strict=True)
                ]
            )
            found = await block.aget(
                [ChatMessage(role=MessageRole.USER, content="护照什么时候过期")]
            )
            await block.close()
            return found

        found = asyncio.run(run())
        self.assertIn("2025年2月18日", found)
        self.assertNotIn("上下文", found)


class ReadmeSnippetTest(ServerTestCase):
    def test_the_readme_snippet_runs(self) -> None:
        scope = run_readme_snippet("integrations.llama_index", self.target, WRITER)
        mem = scope["memory"]
        (block,) = mem.memory_blocks
        self.assertIsInstance(block, MemsvcMemoryBlock)
        said = [ChatMessage(role=MessageRole.USER, content="My bike is a green Brompton.")]

        async def put_then_find() -> str:
            # what the Memory does with a flushed message and on a get (session_id given)
            await block.aput(said, from_short_term_memory=True, session_id=mem.session_id)
            with MemoryClient(self.target, token=WRITER) as client:
                client.wait_for_indexed("user-9", client.export("user-9")[-1].turn_id)
            question = [ChatMessage(role=MessageRole.USER, content="which bike do I ride?")]
            found: str = await block.aget(question, session_id=mem.session_id)
            await block.close()
            return found

        self.assertIn("green Brompton", asyncio.run(put_then_find()))
