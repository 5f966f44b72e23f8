"""The PNG beside a ``make gpu-check`` JSON: what a reader looks at first.

Three panels from the result alone (so any earlier JSON can be redrawn): decode tok/s of
each model against its bandwidth roofline and the transformers peers; the cost of a forward
by row count relative to one row (what verifying k drafts costs); and, for models with real
weights, the one-shot speedup of each speculative mode with its acceptance.
"""
from __future__ import annotations

from pathlib import Path


def write_chart(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = result["models"]
    names = list(models)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    ax = axes[0]
    series = [("ours", lambda r: r["decode_tok_s"]), ("roofline", lambda r: r["roofline_tok_s"]),
              ("HF fp16", lambda r: r["peers"]["hf_fp16_tok_s"]),
              ("torch.compile", lambda r: r["peers"]["torch_compile_tok_s"])]
    width = 0.8 / len(series)
    for i, (label, get) in enumerate(series):
        vals = [get(models[n]) or 0 for n in names]
        vals = [v if v > 0 else float("nan") for v in vals]  # nothing to draw on a log axis
        bars = ax.bar([j + i * width for j in range(len(names))], vals, width, label=label,
                      hatch="//" if label == "roofline" else None, alpha=0.5 if label == "roofline" else 1.0)
        for b, v in zip(bars, vals):
            if v == v:
                ax.text(b.get_x() + b.get_width() / 2, v, f"{v:.0f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names, fontsize=8)
    if any(get(models[n]) for _, get in series for n in names):
        ax.set_yscale("log")  # the roofline is often 10-100x the rest
    ax.set_ylabel("decode tok/s, batch 1 (log)")
    ax.set_title("decode vs roofline and peers")
    ax.legend(fontsize=7)
    ax = axes[1]
    for n in names:
        rows = models[n].get("forward_cost_vs_rows") or {}
        if rows:
            ax.plot([int(r) for r in rows], list(rows.values()), marker="o", label=n)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rows in one forward")
    ax.set_ylabel("cost relative to 1 row")
    ax.set_title("forward cost vs rows")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    ax = axes[2]
    labels, vals, notes = [], [], []
    for n in names:
        for mode, s in (models[n].get("speculative") or {}).items():
            labels.append(f"{n}\n{mode}")
            vals.append(s["speedup"])
            notes.append(f"x{s['speedup']:.2f}\nacc {s['acceptance']:.2f}\n{s['identical'][0]}/{s['identical'][1]} same")
    if vals:
        ax.bar(labels, vals, color=["#4c72b0" if v >= 1 else "#c44e52" for v in vals])
        for i, (v, note) in enumerate(zip(vals, notes)):
            ax.text(i, v, note, ha="center", va="bottom", fontsize=7)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_ylim(0, max(vals + [1.0]) * 1.35)  # room for the notes
        ax.tick_params(axis="x", labelsize=7)
    ax.set_ylabel("one-shot speedup over plain")
    ax.set_title("speculative decoding (real weights)")
    fig.suptitle(f"{result['device']} -- commit {str(result.get('commit'))[:10]} -- {result['date']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
