"""An OpenAI Agents SDK agent whose memory is memsvc: run it twice and the second run
remembers the first. Offline: the model is a small stand-in that answers from the history
the session gives it (no API key, no network); swap in any real model to use it for real.

    .venv/bin/memsvc serve &                      # or make run
    python examples/openai_agents_memory.py "My name is Ana and I live in Lyon."
    python examples/openai_agents_memory.py "Where do I live?"
    -> Earlier you said: My name is Ana and I live in Lyon.

Needs `pip install './clients/python[openai-agents]'`. Flags: --target, --token,
--session (the conversation id, default "example-agent").
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, Runner, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from memsvc_client.integrations.openai_agents import MemsvcSession
from openai.types.responses import ResponseOutputMessage, ResponseOutputText


class RecallModel(Model):
    """Answers with the earliest thing the user said in this session, or a greeting."""

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        said = [i["content"] for i in input if isinstance(i, dict) and i.get("role") == "user"]
        answer = f"Earlier you said: {said[0]}" if len(said) > 1 else "Nice to meet you."
        message = ResponseOutputMessage(
            id="msg",
            type="message",
            role="assistant",
            status="completed",
            content=[ResponseOutputText(type="output_text", text=answer, annotations=[])],
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("message")
    parser.add_argument("--target", default="127.0.0.1:50051")
    parser.add_argument("--token", default=None)
    parser.add_argument("--session", default="example-agent")
    args = parser.parse_args()
    set_tracing_disabled(True)
    session = MemsvcSession(args.session, args.target, token=args.token)
    agent = Agent(name="assistant", model=RecallModel())
    result = await Runner.run(agent, args.message, session=session)
    print(result.final_output)
    await session.close()


if __name__ == "__main__":
    asyncio.run(main())
