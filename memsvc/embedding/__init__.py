"""Embedding: the local model (`model`: tokenizer + FlagEmbedding-loaded weights), its
forward-pass runtimes (`backends`: torch or ONNX Runtime), and query batching."""
