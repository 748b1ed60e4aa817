"""Adapters of memsvc to agent frameworks, each an optional extra of memsvc-client
(`pip install 'memsvc-client[langchain]'`): thin mappings of a framework's types onto the
contract, each module's docstring saying how they map.

- `langchain`: chat message history and retriever (`[langchain]`);
- `openai_agents`: the OpenAI Agents SDK's `Session` (`[openai-agents]`);
- `llama_index`: a long-term memory block of LlamaIndex's `Memory` (`[llama-index]`);
- `google_adk`: a Google ADK memory service (`[google-adk]`).

Shared by them: `_ids` (framework identifiers to conversation ids, injectively), `_hits`
(what a hit says, without its context line), `_kept` (which item ids a conversation
holds, read as it grows); ADK's own: `_adk_matching` (which events of a hit answer a
query, and the similarity floor).
"""
