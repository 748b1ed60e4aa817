"""A LlamaIndex chat whose long-term memory is memsvc: run it twice and the second run's
prompt holds what the first said. Offline: LlamaIndex's `MockLLM` stands in for the model
and answers with the memory the prompt was given; swap in any LLM.

    .venv/bin/memsvc serve &                      # or make run
    python examples/llama_index_memory.py "My sister Lena looks after the dog on Fridays."
    python examples/llama_index_memory.py "Who looks after the dog?"
    -> remembered: ... Lena looks after the dog on Fridays.

Needs `pip install './clients/python[llama-index]'`. Flags: --target, --token, --session.
"""

from __future__ import annotations

import argparse
import asyncio

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.llms import MockLLM
from llama_index.core.memory import Memory
from memsvc_client import MemoryClient
from memsvc_client.integrations.llama_index import MemsvcMemoryBlock


async def chat(message: str, target: str, token: str | None, session: str) -> str:
    block = MemsvcMemoryBlock(target=target, token=token)
    memory = Memory.from_defaults(
        session_id=session,
        memory_blocks=[block],
        # A small short-term budget, so this short run's messages reach memsvc before it
        # ends (a real agent keeps thousands of tokens); whitespace tokens keep it offline.
        token_limit=8,
        chat_history_token_ratio=0.5,
        token_flush_size=4,
        tokenizer_fn=lambda text: text.split(),
    )
    await memory.aput(ChatMessage(role=MessageRole.USER, content=message))
    prompt = await memory.aget()  # the memsvc block's findings are in its system message
    remembered = [
        line.removeprefix("- ")
        for line in (prompt[0].content or "").splitlines()
        if line.startswith("- ")
    ]
    llm = MockLLM(max_tokens=None)  # answers with the prompt it is given: here, the memory
    answer = llm.complete(" / ".join(remembered) or "(nothing yet)").text
    reply = ChatMessage(role=MessageRole.ASSISTANT, content=f"remembered: {answer}")
    await memory.aput(reply)
    await memory.aput(ChatMessage(role=MessageRole.USER, content="(end of the run)"))
    await block.close()
    with MemoryClient(target, token=token) as client:  # searchable before the next run
        last = client.export(session)[-1]
        client.wait_for_indexed(session, last.turn_id)
    return str(reply.content)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("message")
    parser.add_argument("--target", default="127.0.0.1:50051")
    parser.add_argument("--token", default=None)
    parser.add_argument("--session", default="example-llama")
    args = parser.parse_args()
    print(asyncio.run(chat(args.message, args.target, args.token, args.session)))


if __name__ == "__main__":
    main()
