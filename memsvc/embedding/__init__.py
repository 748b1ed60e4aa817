"""Embedding: the local model (`model`: its tokenizer and a forward-pass runtime), how it is
found and loaded (`loading`: FlagEmbedding-loaded weights, the bundled fallback) and the start
on its verified ONNX export alone (`verified_export`, with the tokenizer rebuilt from its
record: `recorded_tokenizer`), the runtimes (`backends`: torch or ONNX Runtime) and the
choice between them per machine (`tuning`), the bundled multilingual model on its own
engine (`e5`: multilingual-e5-small, its prefixes and token counts), the records they keep
in the model cache (`cache_files`: written whole), parts of a text pooled from its forward
pass (`parts`), query batching (`batching`), an OpenAI-compatible server as the model
(`remote`, counting tokens with `tokens`), and the configured one (`providers`)."""
