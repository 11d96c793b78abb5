"""The detector-quality sweep as a table and a figure (issue 25; the modality-bias paper's
finding 2, "analysis fluctuates with the detectors", measured with exact labels): each view's
and the ensemble's accuracy and macro-F1 against the mean held-out accuracy of the detectors
they read, one point per shipped detector set (``bias_jax.analysis.quality_sweep``; the CLI's
``modality-bias analyze --quality-sweep [--figure PATH]``).
"""

from __future__ import annotations

from reproduction import figures as FG

SWEEP_VIEWS = ("benefit", "flow", "causal", "ensemble")


def _pct(x) -> str:
    return "  n/a" if x is None else f"{100 * x:5.1f}"


def _f1(x) -> str:
    return "  n/a" if x is None else f"{x:.3f}"


def sweep_text(sweep: list) -> str:
    """The sweep (entries of ``analysis.quality_sweep``, optional ``"steps"`` / ``"set"``) as
    a fixed-width table: a row per detector set, its mean detector accuracy (%) and each
    view's and the ensemble's accuracy (%) / macro-F1."""
    head = f"{'set':>10} {'det acc':>7}  " + "  ".join(f"{v:>14}" for v in SWEEP_VIEWS)
    rows = [head, f"{'':>10} {'':>7}  " + "  ".join(f"{'acc / F1':>14}" for _ in SWEEP_VIEWS)]
    for e in sweep:
        name = str(e.get("steps", e.get("set", "")))
        rows.append(f"{name:>10} {_pct(e['detector_accuracy']):>7}  " + "  ".join(
            f"{_pct(e[v]['accuracy'])} / {_f1(e[v]['macro_f1'])}".rjust(14)
            for v in SWEEP_VIEWS))
    return "\n".join(rows)


def sweep_markdown(sweep: list) -> str:
    """The sweep as a markdown table (the notes' and docs' form of :func:`sweep_text`)."""
    rows = ["| detector set | mean detector accuracy | " + " | ".join(
        f"{v} acc / macro-F1" for v in SWEEP_VIEWS) + " |",
        "|---|---|" + "---|" * len(SWEEP_VIEWS)]
    for e in sweep:
        name = str(e.get("steps", e.get("set", "")))
        rows.append(f"| {name} | {_pct(e['detector_accuracy']).strip()}% | " + " | ".join(
            f"{_pct(e[v]['accuracy']).strip()}% / {_f1(e[v]['macro_f1'])}"
            for v in SWEEP_VIEWS) + " |")
    return "\n".join(rows)


def quality_sweep_figure(sweep: list, path, title: str | None = None):
    """Two panels, accuracy (%) and macro-F1 of each view and of the ensemble against the
    detector set's mean held-out accuracy (%), a marker per set, sets in increasing detector
    accuracy (the ensemble's points labelled with the set's training steps); written as a PNG at ``path`` atomically (``figures.save_figure``). Returns the
    path."""
    plt = FG.pyplot()
    order = sorted(range(len(sweep)), key=lambda i: sweep[i]["detector_accuracy"])
    xs = [100 * sweep[i]["detector_accuracy"] for i in order]
    nan = float("nan")
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, metric, scale, label in ((axes[0], "accuracy", 100, "accuracy (%)"),
                                     (axes[1], "macro_f1", 1, "macro-F1")):
        for v, style in zip(SWEEP_VIEWS, ("o-", "s-", "^-", "D-")):
            ys = [nan if sweep[i][v][metric] is None else scale * sweep[i][v][metric]
                  for i in order]
            ax.plot(xs, ys, style, label=v, linewidth=2.2 if v == "ensemble" else 1.2)
            if v == "ensemble":  # which set each point is: its training length
                for x, y, i in zip(xs, ys, order):
                    if sweep[i].get("steps") is not None:
                        ax.annotate(f"{sweep[i]['steps']} steps", (x, y), fontsize=7,
                                    textcoords="offset points", xytext=(3, 4))
        ax.set_xlabel("mean held-out detector accuracy (%)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return FG.save_figure(fig, path)


__all__ = ["SWEEP_VIEWS", "sweep_text", "sweep_markdown", "quality_sweep_figure"]
