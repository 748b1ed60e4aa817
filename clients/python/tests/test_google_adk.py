"""memsvc as a Google ADK memory service, against a real memsvc and the real installed
`google-adk` (the `google-adk` extra in the client's venv): ADK's own sessions and events
(InMemorySessionService) added to memory, idempotently as the session grows; searched by
what they say from another process's service; function calls round-tripped exactly;
memories deleted by the id search gave them stay deleted."""

from __future__ import annotations

import asyncio
import itertools
import shutil
import tempfile
import unicodedata

from google.adk.events import Event
from google.adk.memory.base_memory_service import BaseMemoryService
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.sessions import InMemorySessionService, Session
from google.genai import types
from memsvc_client import MemoryClient, pb
from memsvc_client.integrations.google_adk import MemsvcMemoryService, conversation_of

from .test_client import ADMIN, WRITER, ServerTestCase, check_writers_kept, run_writers


def said(author: str, text: str) -> Event:
    role = "user" if author == "user" else "model"
    return Event(author=author, content=types.Content(role=role, parts=[types.Part(text=text)]))


def called() -> Event:
    call = types.FunctionCall(name="lookup_locker", args={"gym": "Harbour Street"})
    return Event(
        author="coach", content=types.Content(role="model", parts=[types.Part(function_call=call)])
    )


def answered() -> Event:
    response = types.FunctionResponse(
        name="lookup_locker", response={"locker": 212, "code": "4417"}
    )
    return Event(
        author="coach",
        content=types.Content(role="user", parts=[types.Part(function_response=response)]),
    )


async def session_with(
    events: list[Event], app: str, user: str
) -> tuple[InMemorySessionService, Session]:
    sessions = InMemorySessionService()
    session = await sessions.create_session(app_name=app, user_id=user)
    for event in events:
        await sessions.append_event(session, event)
    got = await sessions.get_session(app_name=app, user_id=user, session_id=session.id)
    assert got is not None
    return sessions, got


class MemoryServiceTest(ServerTestCase):
    def service(self, token: str = WRITER) -> MemsvcMemoryService:
        return MemsvcMemoryService(self.target, token=token)

    def indexed(self, conversation: str) -> None:
        with MemoryClient(self.target, token=WRITER) as client:
            last = client.export(conversation)[-1].turn_id
            self.assertTrue(client.wait_for_indexed(conversation, last).indexed)

    def test_is_a_memory_service(self) -> None:
        self.assertIsInstance(self.service(), BaseMemoryService)

    def test_a_growing_session_is_added_once_per_event_and_found_by_another_process(self) -> None:
        first = [
            said("user", "I joined the climbing gym on Harbour Street."),
            said("coach", "Great, welcome!"),
        ]

        async def add() -> list[Event]:
            memory = self.service()
            sessions, session = await session_with(first, "gym", "ana")
            await memory.add_session_to_memory(session)
            await memory.add_session_to_memory(session)  # again: nothing twice
            for event in (called(), answered(), said("coach", "Your locker is 212.")):
                await sessions.append_event(session, event)
            grown = await sessions.get_session(app_name="gym", user_id="ana", session_id=session.id)
            assert grown is not None
            await memory.add_session_to_memory(grown)
            kept = await memory.events(app_name="gym", user_id="ana")
            await memory.close()
            self.assertEqual([e.id for e in kept], [e.id for e in grown.events])
            return list(grown.events)

        added = asyncio.run(add())
        with MemoryClient(self.target, token=WRITER) as client:
            turns = client.export("gym/ana")
        self.assertEqual(
            [t.speaker for t in turns], ["user", "assistant", "assistant", "system", "assistant"]
        )
        self.assertEqual(turns[1].speaker_name, "coach")
        self.assertIn('called lookup_locker({"gym": "Harbour Street"})', turns[2].text)
        self.assertIn('"code": "4417"', turns[3].text)
        self.indexed("gym/ana")

        async def search() -> tuple[list[Event], list[str]]:
            memory = self.service()  # another process's service: nothing in common but memsvc
            kept = await memory.events(app_name="gym", user_id="ana")
            found = await memory.search_memory(app_name="gym", user_id="ana", query="locker code")
            await memory.close()
            # each memory is an event as added: the code is in the function's response
            texts = [m.content.model_dump_json() for m in found.memories]
            return kept, texts

        kept, texts = asyncio.run(search())
        self.assertEqual(kept, added)  # exactly, function call and response included
        self.assertTrue(any('"code":"4417"' in t for t in texts), texts)

    def test_two_processes_add_sessions_of_one_user_and_lose_nothing(self) -> None:
        # two workers of one app, each with its own growing session of the same user
        writer = (
            "import asyncio, sys\n"
            "from google.adk.events import Event\n"
            "from google.adk.sessions import InMemorySessionService\n"
            "from google.genai import types\n"
            "from memsvc_client.integrations.google_adk import MemsvcMemoryService\n"
            "def said(author, role, text):\n"
            "    return Event(author=author, content=types.Content(role=role,"
            " parts=[types.Part(text=text)]))\n"
            "async def main():\n"
            "    memory, name = MemsvcMemoryService(sys.argv[1], token=sys.argv[2]), sys.argv[3]\n"
            "    sessions = InMemorySessionService()\n"
            "    session = await sessions.create_session(app_name='shop', user_id='u1')\n"
            "    for i in range(15):\n"
            "        for who, role, text in (('user', 'user', f'{name} {i}'),\n"
            "                                ('coach', 'model', f'{name} ok {i}')):\n"
            "            await sessions.append_event(session, said(who, role, text))\n"
            "        await memory.add_session_to_memory(session)\n"
            "    await memory.close()\n"
            "asyncio.run(main())\n"
        )
        run_writers(writer, self.target)

        async def read() -> list[str]:
            service = self.service()
            try:
                events = await service.events(app_name="shop", user_id="u1")
                return [
                    e.content.parts[0].text or "" for e in events if e.content and e.content.parts
                ]
            finally:
                await service.close()

        check_writers_kept(self, asyncio.run(read()), 15)

    def test_users_are_apart_and_deleted_memories_stay_deleted(self) -> None:
        secret = "The spare key is under the blue flowerpot."

        async def run() -> tuple[list[str], list[str], list[str]]:
            memory = self.service()
            for user, text in (("bo", secret), ("cy", "I keep my keys on a hook by the door.")):
                _, session = await session_with([said("user", text)], "home", user)
                await memory.add_session_to_memory(session)
            self.indexed("home/bo")
            self.indexed("home/cy")
            found = await memory.search_memory(
                app_name="home", user_id="cy", query="spare key flowerpot"
            )
            others = [p.text or "" for m in found.memories for p in (m.content.parts or [])]
            mine = await memory.search_memory(
                app_name="home", user_id="bo", query="spare key flowerpot"
            )
            ids = [m.id or "" for m in mine.memories]
            texts = [p.text or "" for m in mine.memories for p in (m.content.parts or [])]
            for memory_id in ids:
                await memory.delete_memory(app_name="home", user_id="bo", memory_id=memory_id)
            after = await memory.search_memory(
                app_name="home", user_id="bo", query="spare key flowerpot"
            )
            await memory.close()
            return others, texts, [m.id or "" for m in after.memories]

        others, texts, after = asyncio.run(run())
        self.assertFalse(any("flowerpot" in t for t in others))
        self.assertTrue(any("flowerpot" in t for t in texts))
        self.assertEqual(after, [])
        purged = asyncio.run(self.service(ADMIN).purge(app_name="home", user_id="bo"))
        self.assertEqual(purged.events_purged, 1)

    def test_an_unknown_user_has_no_memories(self) -> None:
        found = asyncio.run(
            self.service().search_memory(app_name="x", user_id="nobody", query="anything")
        )
        self.assertEqual(found.memories, [])

    def test_search_memory_does_not_collide_on_slash_in_identifiers(self) -> None:
        # ADK's tests/unittests/memory/test_in_memory_memory_service.py, of that name: app
        # "app/other-user" with user "user" must not be app "app" with user "other-user/user"
        async def run() -> list[MemoryEntry]:
            memory = self.service()
            _, session = await session_with(
                [said("user", "This is a secret.")], "app/other-user", "user"
            )
            await memory.add_session_to_memory(session)
            self.indexed(conversation_of("app/other-user", "user"))
            mine = await memory.search_memory(
                app_name="app/other-user", user_id="user", query="secret"
            )
            said_there = [p.text or "" for m in mine.memories for p in m.content.parts or []]
            self.assertTrue(any("This is a secret." in t for t in said_there), said_there)
            found = await memory.search_memory(
                app_name="app", user_id="other-user/user", query="secret"
            )
            await memory.close()
            return list(found.memories)

        self.assertEqual(asyncio.run(run()), [])

    def test_conversation_ids_are_injective_and_plain_names_unchanged(self) -> None:
        names = [
            "a",
            "a/b",
            "b",
            "a%2Fb",
            "a b",
            "a  b",
            " a",
            "a\tb",
            "é",
            unicodedata.normalize("NFD", "é"),
            "a\u200bb",
            "%",
            "",
            "/",
            "用户",
            "acme/team",
        ]
        pairs = list(itertools.product(names, repeat=2))
        ids = {conversation_of(app, user): (app, user) for app, user in pairs}
        self.assertEqual(len(ids), len(pairs))  # no two pairs share a conversation
        self.assertEqual(conversation_of("gym", "ana"), "gym/ana")  # stored before: unchanged
        self.assertEqual(conversation_of("用户", "a b"), "用户/a b")
        self.assertEqual(conversation_of("X/other-user", "user"), "X%2Fother-user/user")
        self.assertEqual(conversation_of("X", "user", prefix="acme/"), "acme/X/user")
        for conversation in ids:  # memsvc's normal form already: never folded into another
            self.assertEqual(
                conversation, unicodedata.normalize("NFC", " ".join(conversation.split(" ")))
            )
            self.assertNotRegex(conversation, r"\s\s|[^\S ]|^\s|\s$")

    def test_a_session_added_is_found_at_once(self) -> None:
        # issue 63, item 7: a Runner with PreloadMemoryTool started right after
        # add_session_to_memory got no memory (InMemoryMemoryService gives the fact): the
        # service waits until the events are searchable by default
        async def run() -> list[str]:
            memory = self.service()
            _, session = await session_with(
                [said("user", "My passport is in the blue drawer.")], "trip", "ida"
            )
            await memory.add_session_to_memory(session)
            found = await memory.search_memory(app_name="trip", user_id="ida", query="passport")
            await memory.close()
            return [p.text or "" for m in found.memories for p in m.content.parts or []]

        self.assertTrue(any("blue drawer" in t for t in asyncio.run(run())))

    def test_two_processes_adding_one_session_at_once_add_it_once(self) -> None:
        # issue 63, item 9: one session added by two processes at once stored every event
        # twice in 1 of 9 tries; the write's key now comes from the events' ids. On odd
        # tries one process adds a longer slice of the session than the other (then the
        # keys differ): each writes only onto the turn it read (compare-and-append)
        tries = 8
        meet = tempfile.mkdtemp()  # where the two writers wait for each other before each try
        self.addCleanup(shutil.rmtree, meet)
        writer = (
            "import asyncio, pathlib, sys, time\n"
            "from google.adk.events import Event\n"
            "from google.genai import types\n"
            "from memsvc_client.integrations.google_adk import MemsvcMemoryService\n"
            "def said(i, author, role, text):\n"
            "    return Event(id=f'ev-{i}', timestamp=1767225600.0 + i, author=author,"
            " content=types.Content(role=role, parts=[types.Part(text=text)]))\n"
            "async def main():\n"
            "    memory, name = MemsvcMemoryService(sys.argv[1], token=sys.argv[2]), sys.argv[3]\n"
            f"    meet = pathlib.Path({meet!r})\n"
            f"    for k in range({tries}):\n"
            "        count = 6 if k % 2 and name == 'right' else 4\n"
            "        events = [said(i, 'user' if i % 2 == 0 else 'coach',"
            " 'user' if i % 2 == 0 else 'model', f'fact {i} of try {k}') for i in range(count)]\n"
            "        (meet / f'{k}.{name}').touch()\n"
            "        while len(list(meet.glob(f'{k}.*'))) < 2:\n"
            "            time.sleep(0.005)\n"
            "        await memory.add_events_to_memory(app_name='race', user_id=f'u{k}',"
            " events=events)\n"
            "    await memory.close()\n"
            "asyncio.run(main())\n"
        )
        run_writers(writer, self.target)

        async def kept() -> list[list[str]]:
            service = self.service()
            try:
                return [
                    [e.id for e in await service.events(app_name="race", user_id=f"u{k}")]
                    for k in range(tries)
                ]
            finally:
                await service.close()

        added = [[f"ev-{i}" for i in range(6 if k % 2 else 4)] for k in range(tries)]
        self.assertEqual(asyncio.run(kept()), added)

    def test_a_search_that_matches_nothing_finds_nothing(self) -> None:
        # issue 63, item 8: search always returned the nearest memory, where ADK's
        # InMemoryMemoryService returns none (its tests assert it for unrelated queries)
        async def run() -> tuple[list[str], list[str], list[str]]:
            memory = self.service()
            _, session = await session_with(
                [
                    said("user", "The spare key is under the blue flowerpot."),
                    said("helper", "Noted: the spare key is under the blue flowerpot."),
                ],
                "floor",
                "jo",
            )
            await memory.add_session_to_memory(session)

            async def texts(service: MemsvcMemoryService, query: str) -> list[str]:
                found = await service.search_memory(app_name="floor", user_id="jo", query=query)
                return [p.text or "" for m in found.memories for p in m.content.parts or []]

            unrelated = await texts(memory, "quantum chromodynamics lecture")
            related = await texts(memory, "where is the key?")
            every = MemsvcMemoryService(self.target, token=WRITER, min_similarity=None)
            unfloored = await texts(every, "quantum chromodynamics lecture")
            await memory.close()
            await every.close()
            return unrelated, related, unfloored

        unrelated, related, unfloored = asyncio.run(run())
        self.assertEqual(unrelated, [])
        self.assertTrue(any("flowerpot" in t for t in related))
        self.assertTrue(any("flowerpot" in t for t in unfloored))  # the floor is what holds

    def test_memories_are_events_and_a_delete_takes_exactly_one(self) -> None:
        # issue 63, item 8: an entry was a whole chunk (its author "user, assistant", its
        # text "User: …") and delete_memory deleted the chunk, neighbouring events included;
        # InMemoryMemoryService gives one entry per event and deletes that event only
        events = [
            said("user", "My locker code is 4417."),
            said("coach", "Got it, I will remember the code."),
            said("user", "My gym is on Harbour Street."),
        ]

        async def run() -> tuple[list[MemoryEntry], list[str], list[str]]:
            memory = self.service()
            _, session = await session_with(events, "gym2", "lu")
            await memory.add_session_to_memory(session)
            found = await memory.search_memory(app_name="gym2", user_id="lu", query="locker code")
            await memory.delete_memory(app_name="gym2", user_id="lu", memory_id=events[0].id)
            # the app adds the session again after its next turn: the deleted event stays
            # deleted (it came back before; InMemoryMemoryService remembers deleted ids)
            await memory.add_session_to_memory(session)
            after = await memory.search_memory(app_name="gym2", user_id="lu", query="locker code")
            left = [e.id for e in await memory.events(app_name="gym2", user_id="lu")]
            await memory.close()
            return found.memories, [m.id or "" for m in after.memories], left

        found, after, left = asyncio.run(run())
        first = next(m for m in found if m.id == events[0].id)
        self.assertEqual(first.author, "user")
        self.assertEqual(first.content, events[0].content)  # as added, not a rendered line
        self.assertTrue(all(m.id in {e.id for e in events} for m in found))
        self.assertNotIn(events[0].id, after)
        self.assertEqual(left, [events[1].id, events[2].id])  # its neighbours stay

    def test_every_kind_of_part_is_kept_and_read_as_text(self) -> None:
        # issue 83, items 4 and 5: events of code, its result, an image or a file only were
        # not stored (no text), and a function call's memory had no text part, so
        # PreloadMemoryTool showed a bare "Time:" line in one of its top-k slots
        def part_event(part: types.Part, author: str = "coach") -> Event:
            return Event(author=author, content=types.Content(role="model", parts=[part]))

        code = types.ExecutableCode(language=types.Language.PYTHON, code="print(212 * 2)")
        result = types.CodeExecutionResult(outcome=types.Outcome.OUTCOME_OK, output="424")
        image = types.Blob(mime_type="image/png", data=b"\x89PNG....", display_name="locker.png")
        file = types.FileData(file_uri="gs://gym/plan.pdf", mime_type="application/pdf")
        events = [
            part_event(types.Part(executable_code=code)),
            part_event(types.Part(code_execution_result=result)),
            part_event(types.Part(inline_data=image), author="user"),
            part_event(types.Part(file_data=file), author="user"),
            called(),
        ]

        async def run() -> tuple[list[Event], list[MemoryEntry]]:
            memory = self.service()
            _, session = await session_with(events, "parts", "mo")
            await memory.add_session_to_memory(session)
            kept = await memory.events(app_name="parts", user_id="mo")
            found = await memory.search_memory(
                app_name="parts", user_id="mo", query="lookup_locker locker.png print 424 plan.pdf"
            )
            await memory.close()
            return kept, found.memories

        kept, memories = asyncio.run(run())
        self.assertEqual(kept, events)  # exactly as added, every one
        with MemoryClient(self.target, token=WRITER) as client:
            texts = [t.text for t in client.export(conversation_of("parts", "mo"))]
        self.assertEqual(
            texts,
            [
                "ran python code:\nprint(212 * 2)",
                "code result (outcome_ok): 424",
                "[locker.png, image/png, 8 bytes]",
                "[application/pdf, gs://gym/plan.pdf]",
                'called lookup_locker({"gym": "Harbour Street"})',
            ],
        )
        self.assertEqual({m.id for m in memories}, {e.id for e in events})
        for entry in memories:  # the parts as added, then one saying them
            added = next(e for e in events if e.id == entry.id)
            assert entry.content.parts and added.content and added.content.parts
            self.assertEqual(entry.content.parts[:-1], added.content.parts)
            self.assertIn(entry.content.parts[-1].text, texts)

    def test_add_memory_keeps_entries_once_and_finds_them(self) -> None:
        # issue 83, item 8: ADK 2's Context.add_memory reached BaseMemoryService.add_memory,
        # which raises NotImplementedError
        entries = [
            MemoryEntry(
                content=types.Content(parts=[types.Part(text="Ana's locker code is 4417.")]),
                author="coach",
                timestamp="2026-11-30T09:15:00",
            ),
            MemoryEntry(
                id="fact-2",
                content=types.Content(parts=[types.Part(text="Ana climbs on Sundays.")]),
            ),
        ]

        async def run() -> tuple[list[Event], list[MemoryEntry], list[str], list[str]]:
            memory = self.service()
            await memory.add_memory(app_name="facts", user_id="ana", memories=entries)
            await memory.add_memory(app_name="facts", user_id="ana", memories=entries)  # again
            kept = await memory.events(app_name="facts", user_id="ana")
            turns = await memory._memory.export(conversation_of("facts", "ana"))
            found = await memory.search_memory(app_name="facts", user_id="ana", query="locker code")
            await memory.delete_memory(app_name="facts", user_id="ana", memory_id="fact-2")
            left = [e.id for e in await memory.events(app_name="facts", user_id="ana")]
            await memory.close()
            return kept, found.memories, left, [t.speaker for t in turns]

        kept, found, left, speakers = asyncio.run(run())
        self.assertEqual([e.content for e in kept], [m.content for m in entries])
        self.assertEqual(kept[1].id, "fact-2")
        self.assertEqual(kept[0].author, "coach")
        self.assertEqual(found[0].timestamp, "2026-11-30T09:15:00")
        self.assertEqual(found[0].content, entries[0].content)
        self.assertEqual(left, [kept[0].id])
        self.assertEqual(speakers, ["assistant", "system"])  # no author: a system note

    def test_an_add_reads_only_the_turns_written_since_it_last_read(self) -> None:
        # issue 83, item 6: each add re-read the user's whole memory (1,250 ms at 3,000
        # events); a service reads it once, then the turns after what it read, and still
        # adds nothing twice when another process wrote in between
        async def run() -> tuple[list[int], list[str]]:
            memory, other = self.service(), self.service()
            reads: list[int] = []
            export = memory._memory.export

            async def counted(conversation: str, **kw: object) -> list:
                turns = await export(conversation, **kw)  # type: ignore[arg-type]
                if not conversation.endswith("%deleted"):
                    reads.append(len(turns))
                return turns

            memory._memory.export = counted  # type: ignore[method-assign]
            sessions, session = await session_with(
                [said("user", f"fact number {i}") for i in range(30)], "reads", "jo"
            )
            await other.add_session_to_memory(session)  # another process adds 30 events
            await memory.add_session_to_memory(session)  # reads the 30 once, adds nothing
            await sessions.append_event(session, said("coach", "noted"))
            await other.add_session_to_memory(session)  # the other adds the 31st
            await sessions.append_event(session, said("user", "one more fact"))
            await memory.add_session_to_memory(session)  # the turn it read last, the 31st
            await sessions.append_event(session, said("coach", "noted too"))
            await memory.add_session_to_memory(session)  # after its own add: reads nothing
            await memory.add_session_to_memory(session)  # nothing new: reads nothing
            kept = [e.id for e in await other.events(app_name="reads", user_id="jo")]
            await memory.close()
            await other.close()
            self.assertEqual(kept, [e.id for e in session.events])  # each once
            return reads, kept

        reads, _ = asyncio.run(run())
        self.assertEqual(reads, [30, 2])  # the turn read last, and the one another wrote

    def test_the_default_floor_is_the_models_own(self) -> None:
        # issue 83, item 8: a fixed 0.35 had little margin on MiniLM and kept every hit on
        # multilingual-e5-small, whose unrelated texts score 0.75: the floor is a third of
        # the way from the model's unrelated cosine (the server's) to 1.0
        async def run() -> pb.EmbedDbResponse:
            memory = self.service()
            _, session = await session_with([said("user", "I code in Python.")], "fl", "ed")
            await memory.add_session_to_memory(session)
            request = pb.EmbedDbRequest(
                query_text="Java", filters=pb.SearchFilters(conversation_ids=["fl/ed"])
            )
            request.explain = True
            reply: pb.EmbedDbResponse = await memory._memory.call("EmbedDb", request)
            await memory.close()
            return reply

        reply = asyncio.run(run())
        floor = self.service().floor(reply)
        assert floor is not None
        self.assertAlmostEqual(floor, 0.35, delta=0.02)  # MiniLM: unrelated about 0.03
        e5 = pb.EmbedDbResponse(unrelated_similarity=0.75)
        self.assertAlmostEqual(self.service().floor(e5) or 0.0, 0.8325)
        self.assertEqual(MemsvcMemoryService(self.target, min_similarity=0.5).floor(e5), 0.5)
        self.assertIsNone(MemsvcMemoryService(self.target, min_similarity=None).floor(e5))
