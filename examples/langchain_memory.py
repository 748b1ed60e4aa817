"""A LangChain chat loop whose history and recall are memsvc: run it twice and the second
run finds what the first said. Offline: the chat model is LangChain's own fake
(`GenericFakeChatModel`), fed the evidence memsvc retrieves; swap in any chat model.

    .venv/bin/memsvc serve &                      # or make run
    python examples/langchain_memory.py "My sister Lena looks after the dog on Fridays."
    python examples/langchain_memory.py "Who looks after the dog?"
    -> evidence: ... Lena looks after the dog on Fridays.

Needs `pip install './clients/python[langchain]'`. Flags: --target, --token, --session.
"""

from __future__ import annotations

import argparse

from langchain_core.language_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from memsvc_client import MemoryClient
from memsvc_client.integrations.langchain import MemsvcChatMessageHistory, MemsvcRetriever


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("message")
    parser.add_argument("--target", default="127.0.0.1:50051")
    parser.add_argument("--token", default=None)
    parser.add_argument("--session", default="example-chat")
    args = parser.parse_args()
    with MemoryClient(args.target, token=args.token) as memory:
        history = MemsvcChatMessageHistory(args.session, memory, wait=True)
        retriever = MemsvcRetriever(client=memory, conversation_ids=[args.session], top_k=1)
        found = retriever.invoke(args.message) if history.messages else []
        # the chunk without its context line: the turns that are the evidence
        evidence = " / ".join(found[0].page_content.splitlines()[1:]) if found else "(nothing yet)"
        model = GenericFakeChatModel(messages=iter([AIMessage(content=f"evidence: {evidence}")]))
        reply = model.invoke([*history.messages, HumanMessage(content=args.message)])
        history.add_messages([HumanMessage(content=args.message), reply])
        print(reply.content)


if __name__ == "__main__":
    main()
