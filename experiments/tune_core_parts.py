"""Choose and measure the occlusion core-part extractor's thresholds (``views.causal``,
``occlusion_core_parts``: ``OCCLUSION_REL_CELLS`` / ``OCCLUSION_REL_WORDS``) on the graded world.

    python experiments/tune_core_parts.py tune    [--steps N | --detectors-root DIR] [--n 1000]
                                                  [--seed 2000030] [--json]
    python experiments/tune_core_parts.py measure [--steps N | --detectors-root DIR] [--n 2000]
                                                  [--seed ANALYSIS_SEED] [--json]

``tune``: on ``--n`` graded-world samples of the tuning seed (default ``TUNE_SEED`` = 2,000,030:
not ``analysis.ANALYSIS_SEED``, ``evaluate.TRAIN_SEED`` or ``evaluate.EVAL_SEED``), the per-kind
unit-scaled occlusion importances (``causal.occlusion_importances``, one kind at a time) are
computed once; then every threshold in ``GRID`` and every choice of cell kinds (joint, image,
both, and with the lvlm) / word kinds is scored by its mean IoU with the exact core parts
(cells, tokens; ``causal.core_parts_iou``); the best of each is printed (cells and words are
chosen separately: the cell set does not depend on the word threshold and back).

``measure``: on ``--n`` samples of the analysis seed, the core-part IoU of each extractor
(``occlusion``, ``extracted``, ``saliency``) and the causal view's accuracy / macro-F1 with
each of them and with the exact parts, in the paper's and the improved variant's options
(``ensemble.VARIANTS``).

Detectors: ``detectors.shipped_set("graded", --steps)`` (None: the longest), or the
``bias_<kind>`` exports under ``--detectors-root``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TUNE_SEED = 2_000_030
GRID = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
CELL_CHOICES = (("joint",), ("image",), ("joint", "image"), ("joint", "image", "lvlm"),
                ("lvlm",))
WORD_CHOICES = (("text",), ("joint",), ("text", "joint"), ("text", "joint", "lvlm"))


def load(args):
    from bias_jax import detectors as D

    if args.detectors_root:
        root = Path(args.detectors_root)
        return D.load_detectors(root, [k for k in D.KINDS if (root / D.SHIPPED[k]).is_dir()])
    return D.shipped_set("graded", args.steps)


def batch_of(dets, n, seed, world="graded"):
    from bias_jax import analysis as AN

    return AN.closed_world_batch(dets["joint"][2], n, seed, world=world)


def per_kind_importances(dets, batch, fill, chunk=128):
    """kind -> (cell importance [N, S, S], word importance [N, L]) (numpy)."""
    import numpy as np

    from bias_jax.views import causal as CV

    out = {}
    for k in dets:
        cs, ws = [], []
        for s in range(0, batch.size, chunk):
            _, _, c, w = CV.occlusion_importances(dets, batch.image[s:s + chunk],
                                                  batch.tokens[s:s + chunk], cell_kinds=(k,),
                                                  word_kinds=(k,), fill=fill)
            cs.append(np.asarray(c))
            ws.append(np.asarray(w))
        out[k] = (np.concatenate(cs), np.concatenate(ws))
    return out


def tune(args):
    import numpy as np

    from bias_jax.data.text import PAD_ID
    from bias_jax.views import causal as CV

    dets = load(args)
    b = batch_of(dets, args.n, args.seed, args.world)
    true_c, true_w = CV.exact_core_parts(dets["joint"][2].grid_size)(b)
    imps = {f: per_kind_importances(dets, b, f) for f in CV.OCCLUSION_FILLS}
    imp = imps[CV.OCCLUSION_FILL]
    word = np.asarray(b.tokens) != PAD_ID
    rows = []
    for fill in CV.OCCLUSION_FILLS:
        for kinds in CELL_CHOICES:
            if not all(k in imp for k in kinds):
                continue
            ic = np.max([imps[fill][k][0] for k in kinds], axis=0)
            for r in GRID:
                iou = CV.core_parts_iou(ic >= r, true_w, true_c, true_w)["cells"]
                rows.append({"part": "cells", "fill": fill, "kinds": list(kinds), "rel": r,
                             "iou": iou})
    for kinds in WORD_CHOICES:
        if not all(k in imp for k in kinds):
            continue
        iw = np.max([imp[k][1] for k in kinds], axis=0)
        for r in GRID:
            core = word & (iw >= r)
            core = np.where((iw > 0).any(-1, keepdims=True), core, word)
            iou = CV.core_parts_iou(true_c, core, true_c, true_w)["tokens"]
            rows.append({"part": "words", "fill": CV.OCCLUSION_FILL, "kinds": list(kinds),
                         "rel": r, "iou": iou})
    # Reference points that use no detector: every word; every cell that is not the median fill.
    med = np.asarray(CV.occlusion_fill(b.image, "median"))
    n, s_ = len(true_c), true_c.shape[1]
    px = np.asarray(b.image).shape[1] // s_
    diff = (np.asarray(b.image) != med).any(-1).reshape(n, s_, px, s_, px).any((2, 4))
    baselines = {"cells_not_background": CV.core_parts_iou(diff, word, true_c, true_w)["cells"],
                 "cells_all": CV.core_parts_iou(np.ones_like(true_c), word, true_c,
                                                true_w)["cells"],
                 "words_all": CV.core_parts_iou(true_c, word, true_c, true_w)["tokens"]}
    # Does a detector's occlusion rank the core cells above the other non-background ones at
    # all? (AUC over the non-background cells of every sample; 0.5 = no grounding signal.)
    from sklearn.metrics import roc_auc_score

    auc = {}
    for k in imp:
        v = imps["median"][k][0][diff]
        if v.max() > 0 and 0 < true_c[diff].mean() < 1:
            auc[k] = float(roc_auc_score(true_c[diff], v))
    baselines["cell_auc_nonbackground"] = auc
    best = {p: max((x for x in rows if x["part"] == p), key=lambda x: x["iou"])
            for p in ("cells", "words")}
    res = {"seed": args.seed, "n": args.n, "best": best, "baselines": baselines, "rows": rows,
           "default_kinds": {"cells": list(CV.OCCLUSION_CELL_KINDS),
                             "words": list(CV.OCCLUSION_WORD_KINDS)}}
    if args.json:
        print(json.dumps(res))
        return
    for p in ("cells", "words"):
        print(f"{p}: rel  " + "  ".join(f"{r:5.2f}" for r in GRID))
        seen = []
        for x in rows:
            if x["part"] == p and (x["fill"], x["kinds"]) not in seen:
                seen.append((x["fill"], x["kinds"]))
        for fill, kinds in seen:
            vals = [x["iou"] for x in rows
                    if x["part"] == p and x["kinds"] == kinds and x["fill"] == fill]
            print(f"  {fill:6s} {'+'.join(kinds):18s} " + "  ".join(f"{v:5.3f}" for v in vals))
        print(f"  best: {best[p]}")
    print(f"no-detector baselines: {baselines}")


def measure(args):
    import numpy as np

    from bias_jax import ensemble as EN
    from bias_jax import scoring as SC
    from bias_jax.views import causal as CV

    dets = load(args)
    b = batch_of(dets, args.n, args.seed, args.world)
    exact = CV.exact_core_parts(dets["joint"][2].grid_size)(b)
    truth = np.asarray(b.bias)
    view_dets = {k: dets[k] for k in ("image", "text", "joint")}
    res = {"seed": args.seed, "n": args.n, "rel_cells": args.rel_cells,
           "rel_words": args.rel_words, "parts": {}}
    for name in args.parts:
        rel = {k: v for k, v in (("rel_cells", args.rel_cells), ("rel_words", args.rel_words))
               if v is not None}
        fns = {"extracted": lambda: CV.extracted_core_parts(dets, **rel),
               "occlusion": lambda: CV.occlusion_core_parts(dets, **rel),
               "saliency": lambda: CV.core_parts_fn("saliency", dets)}
        parts = exact if name == "exact" else fns[name]()(b)
        row = {"iou": CV.core_parts_iou(*parts, *exact),
               "mean_cells": float(np.asarray(parts[0]).sum((1, 2)).mean()),
               "mean_tokens": float(np.asarray(parts[1]).sum(1).mean())}
        for variant, opts in EN.VARIANTS.items():
            r = CV.causal_view(view_dets, b, core_parts=lambda _b, p=parts: p,
                               **opts["causal"])
            lab = np.asarray(r.label)
            row[variant] = {"accuracy": float((lab == truth).mean()),
                            "macro_f1": SC.macro_f1(lab, truth)}
        res["parts"][name] = row
    if args.json:
        print(json.dumps(res))
        return
    variants = list(EN.VARIANTS)
    print("| core parts | cell IoU | token IoU | mean cells | mean tokens | "
          + " | ".join(f"{v} acc | {v} macro-F1" for v in variants) + " |")
    print("|" + " --- |" * (5 + 2 * len(variants)))
    for name, row in res["parts"].items():
        print(f"| {name} | {row['iou']['cells']:.3f} | {row['iou']['tokens']:.3f} | "
              f"{row['mean_cells']:.2f} | {row['mean_tokens']:.2f} | "
              + " | ".join(f"{row[v]['accuracy']:.3f} | {row[v]['macro_f1']:.3f}"
                           for v in variants) + " |")


def main(argv=None):
    from bias_jax import analysis as AN

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, n, seed in (("tune", 1000, TUNE_SEED), ("measure", 2000, AN.ANALYSIS_SEED)):
        s = sub.add_parser(name)
        s.add_argument("--steps", type=int, default=None)
        s.add_argument("--detectors-root", default=None)
        s.add_argument("--n", type=int, default=n)
        s.add_argument("--seed", type=int, default=seed)
        s.add_argument("--json", action="store_true")
        s.add_argument("--world", default="graded", choices=("graded", "basic"))
        if name == "measure":
            s.add_argument("--rel-cells", type=float, default=None,
                           help="occlusion threshold (default causal.OCCLUSION_REL_CELLS)")
            s.add_argument("--rel-words", type=float, default=None,
                           help="word threshold (default: the extractor's)")
            s.add_argument("--parts", nargs="+", default=["exact", "extracted", "occlusion",
                                                          "saliency"])
    args = p.parse_args(argv)
    (tune if args.cmd == "tune" else measure)(args)


if __name__ == "__main__":
    main()
