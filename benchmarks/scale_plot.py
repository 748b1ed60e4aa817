"""The curves of `make bench-scale` as one PNG: each figure against the chunks held.

    python benchmarks/scale_plot.py RUN.json [RUN.json ...] --out FILE.png

Each RUN.json is what `benchmarks/scale.py --json` wrote (one run per file, named by its
`label` key, else its backend and shards). Dashed lines mark issue 65's targets where it has one.
matplotlib is not a dependency of memsvc: `make bench-scale-plot` installs it when missing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

# (title, unit, [(row key, label)], a target line (value, label) or None)
PANELS: list[tuple[str, str, list[tuple[str, str]], tuple[float, str] | None]] = [
    (
        "hybrid search, p50",
        "ms",
        [("scoped_hybrid_p50_ms", "scoped"), ("unscoped_hybrid_p50_ms", "unscoped")],
        None,  # the scoped target is relative: 1.5x the first stage, drawn per run
    ),
    (
        "GetIndexStatus page (1,000 conversations)",
        "ms",
        [("status_page_ms", "page")],
        (20, "20 ms"),
    ),
    (
        "one turn appended to searchable",
        "ms",
        [("searchable_ms", "append to searchable"), ("purge_one_ms", "delete + purge one")],
        (1000, "purge 1 s (log scale)"),
    ),
    ("start to SERVING", "s", [("start_to_serving_s", "start")], (60, "60 s")),
    (
        "resident memory",
        "MiB",
        [
            ("rss_memsvc_mib", "memsvc"),
            ("rss_milvus_lite_mib", "Milvus Lite"),
            ("rss_total", "sum"),
        ],
        (4096, "4 GiB"),
    ),
    ("load rate", "turns/s", [("load_turns_per_s", "load")], None),
]


def runs(paths: list[Path]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in paths:
        data = json.loads(path.read_text())
        for row in data["rows"]:
            row["rss_total"] = row.get("rss_memsvc_mib", 0) + row.get("rss_milvus_lite_mib", 0)
        name = str(data.get("backend", path.stem))
        if data.get("shards", 1) > 1:
            name += f", {data['shards']} shards"
        out.append((str(data.get("label", name)), data))
    return out


def plot(paths: list[Path], out: Path) -> None:
    loaded = runs(paths)
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    for ax, (title, unit, series, target) in zip(axes.flat, PANELS, strict=True):
        for name, data in loaded:
            chunks = [r["chunks"] for r in data["rows"]]
            for key, label in series:
                values = [r.get(key) for r in data["rows"]]
                if any(v is None for v in values):
                    continue
                tag = f"{label} ({name})" if len(loaded) > 1 else label
                ax.plot(chunks, values, marker="o", label=tag)
            if title.startswith("hybrid"):
                first = data["rows"][0]["scoped_hybrid_p50_ms"]
                ax.axhline(1.5 * first, linestyle="--", color="grey", linewidth=1)
                ax.annotate("scoped target 1.5x", (chunks[0], 1.5 * first), fontsize=8)
        if target is not None:
            ax.axhline(target[0], linestyle="--", color="grey", linewidth=1)
            ax.annotate(target[1], (ax.get_xlim()[0], target[0]), fontsize=8)
        ax.set_xscale("log")
        if target is not None and target[1].endswith("(log scale)"):
            ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("chunks held")
        ax.set_ylabel(unit)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    machine = loaded[0][1].get("machine", "")
    fig.suptitle(f"memsvc on one node as conversations pile up ({machine})", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    plot(args.runs, args.out)


if __name__ == "__main__":
    main()
