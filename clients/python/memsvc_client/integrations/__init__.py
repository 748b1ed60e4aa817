"""Adapters of memsvc to agent frameworks, each an optional extra of memsvc-client
(`pip install 'memsvc-client[langchain]'`): thin mappings of a framework's types onto the
contract, each module's docstring saying how they map."""
