"""Embedding: the local model (`model`: tokenizer + FlagEmbedding-loaded weights), its
forward-pass runtimes (`backends`: torch or ONNX Runtime) and the choice between them per
machine (`tuning`), parts of a text pooled from its forward pass (`parts`), query batching
(`batching`), an OpenAI-compatible server as the model (`remote`, counting tokens with
`tokens`), and the configured one (`providers`)."""
