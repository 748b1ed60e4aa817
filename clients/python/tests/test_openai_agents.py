"""memsvc as an OpenAI Agents SDK session, against a real memsvc and the real installed
`openai-agents` (the `openai-agents` extra in the client's venv). The cases of the SDK's
own session tests (tests/memory/test_session.py: add and get, clear, pop in order and per
session, limits), then what only a shared memory can promise: exact round trips of tool
calls and structured content, an agent run whose second turn sees the first, two
processes writing one session, and deletes that stay deleted.

The model is a scripted stand-in (the SDK's `Model` interface, no network): the subject
here is the session, not the model.

The SDK's own cases (openai-agents 0.24.0, pinned in clients/python/constraints.txt;
tests/memory/test_session.py and test_session_limit.py), and where each lives here:
- memory_basic_functionality, with_explicit_instance (run, run_sync, run_streamed):
  test_an_agent_remembers_across_runs_with_a_tool_call (run; the three methods call the
  same session methods).
- memory_different_sessions, memory_pop_different_sessions: test_pop_in_order_and_per_session.
- sqlite_session_memory_direct: test_add_get_and_clear. memory_pop_item: test_pop_in_order_...
- get_items_with_limit, session_limit_parameter, _limit_zero, _limit_none_gets_all_history,
  _limit_larger_than_history: test_limits_give_the_latest_in_order.
- pop_item_skips_corrupt_most_recent, pop_item_returns_none_after_dropping_only_corrupt_rows:
  test_pop_skips_corrupt_newest_items. get_items_limit_skips_corrupt_newest_rows,
  get_items_session_settings_limit_skips_corrupt_rows: test_a_limit_counts_items_past_...
- unicode_content, special_characters_and_sql_injection:
  test_unicode_and_special_characters_round_trip.
- concurrent_access: test_two_processes_share_one_session_and_lose_nothing (processes, not
  tasks: the stronger case).
- session_settings_default, _constructor, _constructor_normalizes_dictionary,
  _rejects_unknown_dictionary_fields, _resolve, get_items_uses_session_settings_limit,
  get_items_explicit_limit_overrides_session_settings: test_session_settings_as_the_sdk_...
Not applicable, with why:
- await_mutation_cancellation_hides_later_failure_without_loop_error, close_closes_worker_
  thread_connections, file_lock_is_shared_across_instances, failed_add_items_releases_write_
  lock, failed_clear_session_rolls_back, failed_pop_item_releases_write_lock, rollback_
  failure_evicts_connection, close_retries_quarantined_connection, post_commit_cancellation_
  propagates_after_known_outcome: SQLiteSession's own threads, file locks and transactions.
  Here memsvc holds the conversation while it writes; a write it refuses writes nothing and
  raises RefusedEvents (test_a_run_whose_tool_returns_a_huge_output_keeps_every_item).
- closed_rejects_empty_add_items: `close()` releases this session's channel and a later
  call opens another (a network client), so a closed session is not an error.
- memory_disabled, appends_list_input_by_default, callback_prepared_input, callback_
  repeating_history_does_not_grow_session, add_items_exception_propagates_in_streamed,
  runner_with_session_settings_override, session_limit_drops_unmatched_history_function_
  call_output: the Runner's handling of its input and callbacks, the same whatever the
  session; what it asks of the session (get_items with a limit, add_items) is covered above."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.items import ModelResponse, TResponseInputItem
from agents.memory import Session
from agents.models.interface import Model
from agents.usage import Usage
from memsvc_client import MemoryClient
from memsvc_client.client import written
from memsvc_client.integrations.openai_agents import MemsvcSession
from memsvc_client.v1 import memory_pb2 as pb
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from .test_client import (
    ADMIN,
    WRITER,
    ServerTestCase,
    check_writers_kept,
    run_readme_snippet,
    run_writers,
)

set_tracing_disabled(True)  # offline: no trace export


def _message(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


class ScriptedModel(Model):
    """Answers from a script; keeps the input of every call."""

    def __init__(self) -> None:
        self.script: list[list[Any]] = []
        self.inputs: list[list[TResponseInputItem]] = []

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        self.inputs.append(list(input) if isinstance(input, list) else [input])
        return ModelResponse(output=self.script.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the tests run the agent without streaming")


@function_tool
def locker_code(person: str) -> str:
    """The gym locker code of a person."""
    return f"{person}'s locker code is 4417"


class SessionProtocolTest(ServerTestCase):
    """The cases of the SDK's own session tests, against memsvc."""

    def session(self, name: str) -> MemsvcSession:
        return MemsvcSession(f"oa-{name}", self.target, token=WRITER)

    def test_is_a_session(self) -> None:
        self.assertIsInstance(self.session("proto"), Session)

    def test_add_get_and_clear(self) -> None:
        async def flow() -> None:
            session = self.session("direct")
            items: list[TResponseInputItem] = [
                {"role": "user", "content": "Hello"},
                {"role": "assistant", "content": "Hi there!"},
            ]
            await session.add_items(items)
            self.assertEqual(await session.get_items(), items)
            await session.clear_session()
            self.assertEqual(await session.get_items(), [])
            await session.close()

        asyncio.run(flow())

    def test_pop_in_order_and_per_session(self) -> None:
        async def flow() -> None:
            session, other = self.session("pop"), self.session("pop-other")
            self.assertIsNone(await session.pop_item())
            items: list[TResponseInputItem] = [
                {"role": "user", "content": "Hello"},
                {"role": "assistant", "content": "Hi there!"},
                {"role": "user", "content": "How are you?"},
            ]
            await session.add_items(items)
            await other.add_items([{"role": "user", "content": "Session 2 message"}])
            for expected in reversed(items):
                self.assertEqual(await session.pop_item(), expected)
            self.assertIsNone(await session.pop_item())
            self.assertEqual(await session.get_items(), [])
            self.assertEqual(
                await other.get_items(), [{"role": "user", "content": "Session 2 message"}]
            )

        asyncio.run(flow())

    def test_limits_give_the_latest_in_order(self) -> None:
        async def flow() -> None:
            session = self.session("limit")
            items: list[TResponseInputItem] = [
                {"role": "user" if i % 2 == 0 else "assistant", "content": f"Message {i}"}
                for i in range(6)
            ]
            await session.add_items(items)
            self.assertEqual(await session.get_items(), items)
            self.assertEqual(await session.get_items(limit=2), items[-2:])
            self.assertEqual(await session.get_items(limit=4), items[-4:])
            self.assertEqual(await session.get_items(limit=10), items)
            self.assertEqual(await session.get_items(limit=0), [])

        asyncio.run(flow())

    def corrupt_turn(self, session: MemsvcSession) -> None:
        """A turn another client wrote into the session with a payload that is not an
        item's JSON (the upstream tests insert such a row into SQLiteSession's table)."""
        with MemoryClient(self.target, token=WRITER) as client:
            bad = pb.MemoryEvent(
                conversation_id=session.session_id,
                speaker="user",
                text="not an item",
                payload="not valid json {{{",
            )
            written(client.append([bad], assign_turn_ids=True))

    def test_pop_skips_corrupt_newest_items(self) -> None:
        # test_sqlite_session_pop_item_skips_corrupt_most_recent and
        # ..._returns_none_after_dropping_only_corrupt_rows
        async def flow() -> None:
            session, only = self.session("pop-corrupt"), self.session("pop-only-corrupt")
            valid: TResponseInputItem = {"role": "user", "content": "valid"}
            await session.add_items([valid])
            self.corrupt_turn(session)
            self.assertEqual(await session.pop_item(), valid)
            self.assertEqual(await session.get_items(), [])
            self.corrupt_turn(only)
            self.assertIsNone(await only.pop_item())
            self.assertEqual(await only.get_items(), [])

        asyncio.run(flow())

    def test_a_limit_counts_items_past_corrupt_newest_ones(self) -> None:
        # test_sqlite_session_get_items_limit_skips_corrupt_newest_rows and
        # ..._session_settings_limit_skips_corrupt_rows
        async def flow() -> None:
            session = self.session("limit-corrupt")
            items: list[TResponseInputItem] = [
                {"role": "user" if i % 2 == 0 else "assistant", "content": f"valid {i}"}
                for i in range(3)
            ]
            await session.add_items(items)
            self.corrupt_turn(session)
            self.corrupt_turn(session)
            self.assertEqual(await session.get_items(limit=2), items[1:])
            self.assertEqual(await session.get_items(), items)
            settled = MemsvcSession(
                session.session_id, self.target, token=WRITER, session_settings={"limit": 2}
            )
            self.assertEqual(await settled.get_items(), items[1:])

        asyncio.run(flow())

    def test_unicode_and_special_characters_round_trip(self) -> None:
        # test_sqlite_session_unicode_content, ..._special_characters_and_sql_injection
        async def flow() -> None:
            session = self.session("unicode")
            items: list[TResponseInputItem] = [
                {"role": "user", "content": "こんにちは 你好，护照放哪了？ 😊👍"},
                {"role": "assistant", "content": "Привет Ω≈ç√ \\ \"quoted\" 'single'"},
                {"role": "user", "content": "O'Reilly'); DROP TABLE messages; --"},
                {"role": "assistant", "content": "%s %d {0} ${x} <script>alert(1)</script>"},
            ]
            await session.add_items(items)
            self.assertEqual(await session.get_items(), items)

        asyncio.run(flow())


class SharedMemoryTest(ServerTestCase):
    def test_tool_calls_and_structured_content_round_trip_exactly(self) -> None:
        items: list[Any] = [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is Ana's locker code? 谢谢"},
                ],
            },
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": "locker_code",
                "arguments": '{"person": "Ana"}',
                "status": "completed",
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "Ana's code: 4417"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {
                        "type": "output_text",
                        "text": "Ana's locker code is 4417.",
                        "annotations": [{"type": "url_citation", "url": "https://x", "title": "t"}],
                    }
                ],
            },
        ]

        async def flow() -> list[Any]:
            session = MemsvcSession("oa-exact", self.target, token=WRITER)
            await session.add_items(items)
            return await session.get_items()

        self.assertEqual(asyncio.run(flow()), items)
        # what search sees is the items' text; the tool's output is evidence like any turn
        with MemoryClient(self.target, token=WRITER) as memory:
            events = memory.export("oa-exact")
            self.assertEqual(
                [(e.speaker, e.text) for e in events],
                [
                    ("user", "What is Ana's locker code? 谢谢"),
                    ("assistant", 'locker_code\n{"person": "Ana"}'),
                    ("system", "Ana's code: 4417"),
                    ("assistant", "[reasoning]"),
                    ("assistant", "Ana's locker code is 4417."),
                ],
            )
            memory.wait_for_indexed("oa-exact", events[-1].turn_id)
            hits = memory.search("Ana locker code", conversation_ids=["oa-exact"])
            self.assertIn("4417", hits[0].text)

    def test_a_tool_output_of_parts_is_searched_by_what_it_says(self) -> None:
        # issue 83, item 8: a function_call_output whose output is a list of parts (the
        # Responses API's input_text / input_image / input_file) was indexed as
        # "[function_call_output]", so its text was never found
        output = [
            {"type": "input_text", "text": "Ana's gym badge number is 5531."},
            {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="},
            {"type": "input_file", "filename": "badge.pdf", "file_data": "JVBERi0="},
        ]
        item = {"type": "function_call_output", "call_id": "call_9", "output": output}

        async def flow() -> list[Any]:
            session = MemsvcSession("oa-parts", self.target, token=WRITER)
            await session.add_items([item])  # type: ignore[list-item]
            return await session.get_items()

        self.assertEqual(asyncio.run(flow()), [item])
        with MemoryClient(self.target, token=WRITER) as memory:
            (event,) = memory.export("oa-parts")
            self.assertEqual(
                event.text, "Ana's gym badge number is 5531.\n[image]\n[file badge.pdf]"
            )
            memory.wait_for_indexed("oa-parts", event.turn_id)
            hits = memory.search("badge number", conversation_ids=["oa-parts"])
            self.assertIn("5531", hits[0].text)

    def test_an_agent_remembers_across_runs_with_a_tool_call(self) -> None:
        model = ScriptedModel()
        agent = Agent(name="assistant", model=model, tools=[locker_code])
        call = ResponseFunctionToolCall(
            id="fc_9",
            call_id="call_9",
            type="function_call",
            name="locker_code",
            arguments='{"person": "Ana"}',
            status="completed",
        )
        model.script = [[call], [_message("Ana's code is 4417.")], [_message("It was 4417.")]]

        async def first() -> None:
            session = MemsvcSession("oa-agent", self.target, token=WRITER)
            result = await Runner.run(agent, "What is Ana's locker code?", session=session)
            self.assertEqual(result.final_output, "Ana's code is 4417.")

        asyncio.run(first())
        # the next run, on another event loop (another process would do the same)
        session = MemsvcSession("oa-agent", self.target, token=WRITER)
        result = Runner.run_sync(agent, "What was the code again?", session=session)
        self.assertEqual(result.final_output, "It was 4417.")
        seen = model.inputs[-1]
        kinds = [i.get("type", "message") for i in seen]
        self.assertEqual(
            kinds,
            ["message", "function_call", "function_call_output", "message", "message"],
        )
        self.assertEqual(seen[1]["call_id"], "call_9")
        self.assertIn("4417", seen[2]["output"])

    def test_a_run_whose_tool_returns_a_huge_output_keeps_every_item(self) -> None:
        # issue 63, item 4: a tool returned 1.35M characters; Runner.run raised after the
        # model answered and the session kept 1 of 4 items (SQLiteSession kept them all).
        # Now the item is stored whole and searchable by the head of its text.
        huge = "row 12345: ok; " * 90_000  # 1.35M characters

        @function_tool
        def dump_table(name: str) -> str:
            """Every row of a table."""
            return huge

        model = ScriptedModel()
        agent = Agent(name="assistant", model=model, tools=[dump_table])
        call = ResponseFunctionToolCall(
            id="fc_1",
            call_id="call_1",
            type="function_call",
            name="dump_table",
            arguments='{"name": "orders"}',
            status="completed",
        )
        model.script = [[call], [_message("The table has 90,000 rows.")]]

        async def run() -> list[TResponseInputItem]:
            session = MemsvcSession("oa-huge", self.target, token=WRITER)
            result = await Runner.run(agent, "Dump the orders table.", session=session)
            self.assertEqual(result.final_output, "The table has 90,000 rows.")
            items = await session.get_items()
            await session.close()
            return items

        items = asyncio.run(run())
        self.assertEqual(
            [i.get("type", "message") for i in items],
            ["message", "function_call", "function_call_output", "message"],
        )
        self.assertEqual(items[2]["output"], huge)  # whole, not cut

    def test_session_settings_as_the_sdk_takes_them(self) -> None:
        # issue 63: session_settings={"limit": 0}, a dict the SDK accepts, crashed get_items;
        # the default is SessionSettings(), as SQLiteSession's; limits as SQLiteSession reads
        # them (0: nothing; negative: everything)
        from agents.memory.session_settings import SessionSettings

        async def flow() -> None:
            items: list[TResponseInputItem] = [
                {"role": "user", "content": f"Message {i}"} for i in range(3)
            ]
            writer = MemsvcSession("oa-settings", self.target, token=WRITER)
            await writer.add_items(items)
            self.assertEqual(writer.session_settings, SessionSettings())
            for settings, expected in (
                ({"limit": 0}, []),
                ({"limit": 2}, items[-2:]),
                ({"limit": -1}, items),
                (SessionSettings(limit=1), items[-1:]),
                ({}, items),
            ):
                session = MemsvcSession(
                    "oa-settings", self.target, token=WRITER, session_settings=settings
                )
                self.assertEqual(await session.get_items(), expected, settings)
                self.assertEqual(await session.get_items(limit=3), items)
                await session.close()
            await writer.close()

        asyncio.run(flow())

    def test_two_processes_share_one_session_and_lose_nothing(self) -> None:
        writer = (
            "import asyncio, sys\n"
            "from memsvc_client.integrations.openai_agents import MemsvcSession\n"
            "async def main():\n"
            "    s = MemsvcSession('oa-shared', sys.argv[1], token=sys.argv[2])\n"
            "    name = sys.argv[3]\n"
            "    for i in range(15):\n"
            "        await s.add_items([{'role': 'user', 'content': f'{name} {i}'},\n"
            "                           {'role': 'assistant', 'content': f'{name} ok {i}'}])\n"
            "asyncio.run(main())\n"
        )
        run_writers(writer, self.target)

        async def read() -> list[Any]:
            return await MemsvcSession("oa-shared", self.target, token=WRITER).get_items()

        check_writers_kept(self, [i["content"] for i in asyncio.run(read())], 15)

    def test_popped_and_cleared_items_stay_deleted_and_purge_erases_them(self) -> None:
        async def flow() -> None:
            session = MemsvcSession("oa-forget", self.target, token=WRITER)
            await session.add_items(
                [
                    {"role": "user", "content": "My passport number is K1234567."},
                    {"role": "user", "content": "My cat is called Miso."},
                ]
            )
            popped = await session.pop_item()
            self.assertEqual(popped, {"role": "user", "content": "My cat is called Miso."})
            await session.add_items([{"role": "user", "content": "I live in Lyon."}])
            self.assertEqual(
                [i["content"] for i in await session.get_items()],
                ["My passport number is K1234567.", "I live in Lyon."],
            )
            await session.clear_session()
            self.assertEqual(await session.get_items(), [])
            admin = MemsvcSession("oa-forget", self.target, token=ADMIN)
            purged = await admin.purge()
            self.assertEqual(purged.events_purged, 3)

        asyncio.run(flow())
        with MemoryClient(self.target, token=WRITER) as memory:
            deadline = time.monotonic() + 60
            while (
                memory.status(["oa-forget"]).conversations[0].backlog
                and time.monotonic() < deadline
            ):
                time.sleep(0.2)
            for query in ("passport number", "cat Miso", "Lyon"):
                hits = memory.search(query, conversation_ids=["oa-forget"])
                self.assertEqual(hits, [], query)


class ReadmeSnippetTest(ServerTestCase):
    def test_the_readme_snippet_runs(self) -> None:
        model = ScriptedModel()
        model.script = [[_message("Hello Ana.")]]
        scope = run_readme_snippet(
            "integrations.openai_agents", self.target, WRITER, {"model": model}
        )
        self.assertEqual(scope["result"].final_output, "Hello Ana.")

        async def stored() -> list[Any]:
            return await MemsvcSession("user-42", self.target, token=WRITER).get_items()

        items = asyncio.run(stored())
        self.assertEqual(items[0], {"role": "user", "content": "I'm Ana."})
        self.assertEqual(items[1]["content"][0]["text"], "Hello Ana.")
