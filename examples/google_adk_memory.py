"""A Google ADK agent whose memory service is memsvc: run it twice and the second run, a new
session, is given what the first one said. Offline: a stand-in model answers with the
memories ADK's `preload_memory` tool put into its request; swap in any model.

    .venv/bin/memsvc serve &                      # or make run
    python examples/google_adk_memory.py "My sister Lena looks after the dog on Fridays."
    python examples/google_adk_memory.py "Who looks after the dog?"
    -> remembered: ... Lena looks after the dog on Fridays.

Needs `pip install './clients/python[google-adk]'`. Flags: --target, --token, --session
(the user id: memory is per app and user, each run is a new session).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncGenerator

from google.adk.agents import Agent
from google.adk.models import BaseLlm, LlmRequest, LlmResponse
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.adk.tools.preload_memory_tool import PreloadMemoryTool
from google.genai import types
from memsvc_client import MemoryClient
from memsvc_client.integrations.google_adk import MemsvcMemoryService, conversation_of

APP = "example-adk"


class RememberingModel(BaseLlm):
    """Answers with the past conversations ADK gave it, or a greeting when there are none."""

    model: str = "remembering-stand-in"

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        said = "\n".join(p.text or "" for c in llm_request.contents for p in c.parts or [])
        past = said.partition("<PAST_CONVERSATIONS>")[2].partition("</PAST_CONVERSATIONS>")[0]
        # ADK's lines are "Time: <when>" and "<author>: <text>"; keep the texts.
        lines = [
            line.partition(": ")[2]
            for line in past.splitlines()
            if ": " in line and not line.startswith("Time: ")
        ]
        answer = f"remembered: {' / '.join(lines)}" if lines else "Nice to meet you."
        yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=answer)]))


async def chat(message: str, target: str, token: str | None, user: str) -> str:
    memory = MemsvcMemoryService(target, token=token)
    sessions = InMemorySessionService()  # this run's session only: the past is in memsvc
    agent = Agent(name="assistant", model=RememberingModel(), tools=[PreloadMemoryTool()])
    runner = Runner(app_name=APP, agent=agent, session_service=sessions, memory_service=memory)
    session = await sessions.create_session(app_name=APP, user_id=user)
    answer = ""
    user_says = types.Content(role="user", parts=[types.Part(text=message)])
    async for event in runner.run_async(user_id=user, session_id=session.id, new_message=user_says):
        if event.content and event.content.parts and event.content.parts[0].text:
            answer = event.content.parts[0].text
    done = await sessions.get_session(app_name=APP, user_id=user, session_id=session.id)
    assert done is not None
    await memory.add_session_to_memory(done)
    await memory.close()
    with MemoryClient(target, token=token) as client:  # searchable before the next run
        conversation = conversation_of(APP, user)
        client.wait_for_indexed(conversation, client.export(conversation)[-1].turn_id)
    return answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("message")
    parser.add_argument("--target", default="127.0.0.1:50051")
    parser.add_argument("--token", default=None)
    parser.add_argument("--session", default="example-user")
    args = parser.parse_args()
    print(asyncio.run(chat(args.message, args.target, args.token, args.session)))


if __name__ == "__main__":
    main()
