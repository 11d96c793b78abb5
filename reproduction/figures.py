"""Figures of the reproduction. Heatmap figures of local attributions: the visual map over the
rendered scene with the ground-truth cells outlined, and the textual map as bars over the
question's tokens; ``pyplot`` / ``save_figure`` for the report's other plots.

Host-side only (matplotlib with the Agg backend, no display needed). One figure per sample: a
column per explainer, the scene overlay on top and the token bars below; ground-truth cells
(A ∪ T) get a green outline, ground-truth tokens green bars. Files are written atomically (a
temporary file in the same directory, renamed when complete).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mmx_base import staging
from gridvqa_jax.world import universe as U


def pyplot():
    """``matplotlib.pyplot`` with the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def token_words(tokens) -> list[str]:
    """The words of a token id row [L] up to the first PAD."""
    out = []
    for t in np.asarray(tokens).tolist():
        if t == U.PAD_ID:
            break
        out.append(U.VOCAB[t])
    return out


def heatmap_figure(scene, maps: dict, *, cell_px: int = 64, title: str | None = None):
    """A matplotlib Figure for one sample.

    ``scene``: one ``Scene`` (numpy, no batch axis); ``maps``: ``{name: (visual [S, S],
    textual [L])}``. Each column shows ``|visual|`` (normalised to its maximum) as a translucent
    heatmap over the scene rendered at ``cell_px``, with the ground-truth cells outlined, and
    below it ``|textual|`` per token with ground-truth tokens in green.
    """
    from gridvqa_jax.world import render as R

    plt = pyplot()
    from matplotlib.patches import Rectangle

    image = np.asarray(R.render(np.asarray(scene.color), np.asarray(scene.shape), cell_px))
    S = int(np.shape(scene.color)[-1])
    words = token_words(scene.tokens)
    gt_tok = np.asarray(scene.gt_tokens, bool)[:len(words)]
    gt_cells = np.asarray(scene.gt_cells, bool)
    names = list(maps)
    fig, axes = plt.subplots(2, max(1, len(names)), figsize=(3.2 * max(1, len(names)), 6.4),
                             squeeze=False, gridspec_kw={"height_ratios": [3, 2]})
    for c, name in enumerate(names):
        vis, txt = (np.abs(np.asarray(m, np.float64)) for m in maps[name])
        ax = axes[0, c]
        ax.imshow(image)
        top = vis.max()
        ax.imshow(vis / top if top > 0 else vis, cmap="inferno", alpha=0.55, vmin=0, vmax=1,
                  extent=(0, S * cell_px, S * cell_px, 0), interpolation="nearest")
        for y, x in zip(*np.nonzero(gt_cells)):
            ax.add_patch(Rectangle((x * cell_px, y * cell_px), cell_px, cell_px, fill=False,
                                   edgecolor="lime", linewidth=2))
        ax.set_title(name)
        ax.set_xticks([])
        ax.set_yticks([])
        bx = axes[1, c]
        vals = txt[:len(words)]
        bx.bar(np.arange(len(words)), vals, color=np.where(gt_tok, "tab:green", "tab:gray"))
        bx.set_xticks(np.arange(len(words)))
        bx.set_xticklabels(words, rotation=90, fontsize=7)
        bx.set_yticks([])
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def save_heatmap(path, scene, maps: dict, *, cell_px: int = 64, title: str | None = None,
                 dpi: int = 80) -> Path:
    """Write ``heatmap_figure(scene, maps)`` as a PNG at ``path`` (atomic: a temporary file in
    the same directory renamed to ``path``); returns the path."""
    plt = pyplot()
    fig = heatmap_figure(scene, maps, cell_px=cell_px, title=title)
    try:
        return staging.write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=dpi))
    finally:
        plt.close(fig)


def save_figure(fig, path, dpi: int = 110) -> Path:
    """Write a matplotlib figure as a PNG at ``path`` (atomic) and close it; returns the path."""
    try:
        return staging.write_atomic(path, lambda f: fig.savefig(f, dpi=dpi, format="png"))
    finally:
        pyplot().close(fig)


__all__ = ["pyplot", "token_words", "heatmap_figure", "save_heatmap", "save_figure"]
