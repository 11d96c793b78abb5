"""The accuracy section of the reproduction: the three regimes per bucket and GridVQA-X
Table 2's accuracy rows, with their findings and figure.

* ``run_regimes``: the accuracy of the three regimes (pure = M_pure on D_pure, spurious =
  M_spur on D_spur, cross = M_spur on D_pure) per bucket on ``acc_n`` held-out samples per
  density (seed ``ACC_SEED`` + density index, as ``gridvqa evaluate``), and Table 2's accuracy
  rows (M_pure and M_spur on D_pure, Mixed, form 0, d07, depths 1-3; ``t2_n`` samples per cell,
  seed ``T2_SEED`` + bucket id), each with a Wilson 95% interval (``stats.wilson``);
* ``check_findings``: the paper's behavioural claims about the reference models;
* ``accuracy_figure``: Table 2's accuracy rows, ours beside the paper's.

Under multi-process JAX the predictions are sharded over the global mesh of every process's
devices (``sharded_predictions``): every process calls ``run_regimes`` together.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils as MU
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from gridvqa_jax import evaluate as E
from gridvqa_jax.evaluate import bucket_key, render_batch
from gridvqa_jax.explain import synergy_check as SC
from gridvqa_jax.models import mdetr as M
from gridvqa_jax.training import export as EX
from gridvqa_jax.world import generate as G
from gridvqa_jax.world import universe as U
from reproduction import figures as FG
from reproduction import stats as STATS

ACC_SEED = 777_000  # = gridvqa_jax.evaluate.EVAL_SEED (+ density index)
T2_SEED = 779_000  # Table 2 accuracy rows: seed T2_SEED + bucket id (no other stream uses it)
T2_BUCKETS = ("D1_M_F0", "D2_M_F0", "D3_M_F0")
# GridVQA-X Table 2, accuracy (%) on D_pure, Mixed, form 0, d07, depths 1-3.
PAPER_T2_ACC = {"M_pure": (100.0, 100.0, 100.0), "M_spur": (6.0, 2.0, 0.0),
                "Qwen3-VL-30B": (14.0, 10.0, 10.0), "LLaVA-1.5-7B": (6.0, 28.0, 30.0)}


@functools.lru_cache(maxsize=None)
def _predictor(apply_fn, mesh):
    # one jitted function per (architecture, mesh): every regime, density and bucket reuses
    # its compilation (a new jit per call recompiled the model each time, ~4 s on a CPU)
    rows, rep = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())

    def fwd(p, img, tok):
        return jnp.argmax(apply_fn(p, img, tok)["answer_logprobs"], -1).astype(jnp.int32)

    return jax.jit(fwd, in_shardings=(rep, rows, rows), out_shardings=rows)


def sharded_predictions(apply_fn, params, color, shape, tokens, *, cell_px: int = 16,
                        batch: int = 256) -> np.ndarray:
    """Predicted answer class int [N] of a model on N scenes, sharded over every device of
    every process: each chunk of ``batch`` rows (padded to a multiple of the global device
    count) is laid out along a 1-d mesh ``("data",)`` over ``jax.devices()``; a process renders
    only the rows of its addressable devices; the predictions are all-gathered, so every
    process returns all N. ``color``, ``shape`` int [N, S, S] and ``tokens`` int [N, L] must be
    the same on every process (generate them from the same seed)."""
    mesh = Mesh(np.asarray(jax.devices()), ("data",))
    rows, rep = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    n_dev = mesh.devices.size
    G = -(-batch // n_dev) * n_dev
    params_g = jax.device_put(params, rep)
    fwd = _predictor(apply_fn, mesh)
    N = len(tokens)
    out = []
    for a in range(0, N, G):
        idx = np.arange(a, a + G).clip(max=N - 1)  # pad with the last row: one compile
        shards_img, shards_tok = [], []
        dmap = rows.addressable_devices_indices_map((G,))
        for dev, (sl,) in dmap.items():
            r = idx[sl]
            img = render_batch(jnp.asarray(color[r]), jnp.asarray(shape[r]), cell_px)
            shards_img.append(jax.device_put(img, dev))
            shards_tok.append(jax.device_put(jnp.asarray(tokens[r]), dev))
        H = shards_img[0].shape[1:]
        img_g = jax.make_array_from_single_device_arrays((G,) + H, rows, shards_img)
        tok_g = jax.make_array_from_single_device_arrays((G, tokens.shape[1]), rows, shards_tok)
        pred = fwd(params_g, img_g, tok_g)
        if jax.process_count() > 1:
            pred = MU.process_allgather(pred, tiled=True)
        out.append(np.asarray(pred)[: min(G, N - a)])
    return np.concatenate(out) if out else np.zeros((0,), np.int32)


def local_scenes(spec, seed: int, n: int):
    """n scenes of ``spec`` from ``seed`` (numpy Scene batch), generated on this process's
    devices only (every process gets the same scenes from the same seed)."""
    return G.to_numpy(G.generate_chunk(spec, seed, 0, n, G.data_mesh(jax.local_devices()),
                                       lanes=G.DRAW_LANES))


def local_bucket_scenes(spec, seeds: dict, n: int, lanes: int = 0):
    """``n`` scenes per bucket id of ``seeds`` (``{bucket id: seed}``), sample ``i`` of bucket
    ``b`` drawn with key ``fold_in(key(seeds[b]), i)`` from ``spec`` (which must hold every
    bucket), as one numpy Scene batch (buckets in ``seeds`` order). Equal sample by sample to
    ``local_scenes(Spec(..., buckets=(b,)), seeds[b], n)`` (``generate.sample_batch`` draws a
    lane from its key and bucket alone); one call of one spec, so every bucket shares the
    generator's compiled programs; ``lanes``: draw at least this many lanes
    (``generate.sample_lanes``), to reuse a program compiled for that batch size. Generated on
    this process's devices only."""
    missing = sorted(set(seeds) - set(spec.buckets))
    if missing:
        raise ValueError(f"bucket ids {missing} are not buckets of {spec}")
    keys = jnp.concatenate([G.sample_keys(s, 0, n) for s in seeds.values()])
    buckets = np.repeat(np.asarray(list(seeds), np.int32), n)
    return G.to_numpy(G.sample_lanes(keys, spec, buckets, lanes,
                                     G.data_mesh(jax.local_devices())))


def _correct_by_bucket(model, scenes, dk, cell_px, batch, into):
    apply_fn, params = model
    pred = sharded_predictions(apply_fn, params, scenes.color, scenes.shape, scenes.tokens,
                               cell_px=cell_px, batch=batch)
    C = scenes.color.shape[1] * scenes.color.shape[2]
    truth = np.asarray(M.answer_index(scenes.answer, scenes.is_yesno, C))
    for bid, ok in zip(scenes.bucket, pred == truth):
        k, c = into.setdefault(bucket_key(bid, dk), [0, 0])
        into[bucket_key(bid, dk)] = [k + int(ok), c + 1]


def acc_row(k: int, n: int) -> dict:
    """One accuracy cell: ``{"acc": 100 k / n (None for n = 0), "k", "n", "ci": Wilson 95%
    interval in %}``."""
    lo, hi = STATS.wilson(k, n)
    return {"acc": 100 * k / n if n else None, "k": k, "n": n, "ci": [100 * lo, 100 * hi]}


def run_regimes(sizes: dict, progress=lambda *_: None) -> dict:
    """Accuracy of the three regimes per bucket (``acc_n`` held-out samples per density, seed
    ``ACC_SEED`` + density index, as ``gridvqa evaluate``) and Table 2's accuracy rows
    (``t2_n`` D_pure samples per bucket D{1,2,3}_M_F0 at d07, seed ``T2_SEED`` + bucket id).
    Every process calls this together (collective). Accuracies in %, with Wilson 95% CIs."""
    models = {}
    for _, m, _ in E.REGIMES:
        if m not in models:
            fn, params, spec = EX.load_reference_model(m)
            models[m] = (fn, params)
    grid = 5
    regimes = {}
    for name, m, d in E.REGIMES:
        counts: dict = {}
        for i, dk in enumerate(("d03", "d07")):
            spec = U.Spec.feasible(d, grid, U.DENSITIES[dk])[0]
            sc = local_scenes(spec, ACC_SEED + i, sizes["acc_n"])
            _correct_by_bucket(models[m], sc, dk, 16, 256, counts)
            progress(f"regimes: {name} {dk}")
        K = sum(k for k, _ in counts.values())
        N = sum(c for _, c in counts.values())
        regimes[name] = {"model": m, "data": d, "overall": acc_row(K, N),
                         "buckets": {b: acc_row(*kc) for b, kc in sorted(counts.items())}}
    t2 = {}
    bids = {b: SC.bucket_id(b) for b in T2_BUCKETS}
    # the spec (and lane count) of the pure d07 regime data: the generator is compiled already
    t2_scenes = local_bucket_scenes(U.Spec.feasible("pure", grid, U.DENSITIES["d07"])[0],
                                    {bid: T2_SEED + bid for bid in bids.values()}, sizes["t2_n"],
                                    lanes=G.DRAW_LANES)
    for row, m in (("M_pure", "pure"), ("M_spur", "spur")):
        counts = {}
        _correct_by_bucket(models[m], t2_scenes, "d07", 16, 256, counts)
        t2[row] = {f"{b}_d07": acc_row(*counts[bucket_key(bid, "d07")])
                   for b, bid in bids.items()}
        progress(f"regimes: Table 2 accuracy {row}")
    return {"regimes": regimes, "table2_accuracy": t2, "paper_table2_accuracy": PAPER_T2_ACC,
            "n_per_density": sizes["acc_n"], "n_per_bucket_table2": sizes["t2_n"],
            "seeds": {"regimes": ACC_SEED, "table2": T2_SEED}, "cell_px": 16}


def check_findings(res: dict) -> list[dict]:
    """GridVQA-X's behavioural claims about the reference models, checked on ``run_regimes``:
    M_pure above 90% and M_spur below 20% at every depth of Table 2's accuracy rows
    (``stats.all_of`` the per-depth Wilson intervals), and M_spur above 90% on D_pure's
    attribute-only questions. Returns ``stats.finding`` records."""
    out = []
    t2 = res["table2_accuracy"]
    for row, claim, text in (
            ("M_pure", (">", 90.0), "M_pure answers D_pure Mixed count questions at depths 1-3 "
             "(accuracy > 90% at every depth)"),
            ("M_spur", ("<", 20.0), "M_spur collapses on D_pure Mixed count questions at depths "
             "1-3 (accuracy < 20% at every depth)")):
        paper = " / ".join(f"{a:g}" for a in PAPER_T2_ACC[row])
        cells = list(t2[row].values())
        v = STATS.all_of(STATS.verdict(c["ci"], claim) for c in cells)
        ev = "; ".join(f"{b}: {c['acc']:.1f}% [{c['ci'][0]:.1f}, {c['ci'][1]:.1f}] (n={c['n']})"
                       for b, c in t2[row].items()) + f" (paper {paper})"
        out.append(STATS.finding("GridVQA-X", f"Table 2 accuracy: {row}", text, v, ev,
                                 n=f"{min(c['n'] for c in cells)} per bucket",
                                 width=STATS.widest(c["ci"] for c in cells)))
    cross = res["regimes"]["cross"]["buckets"]
    att = [(b, c) for b, c in cross.items() if b.startswith("D1_A_")]
    if att:
        k, n = sum(c["k"] for _, c in att), sum(c["n"] for _, c in att)
        row = acc_row(k, n)
        out.append(STATS.finding(
            "GridVQA-X", "M_spur keeps attribute-only questions on D_pure",
            "M_spur stays near 100% on attribute-only (D1 A) questions of D_pure (> 90%)",
            STATS.verdict(row["ci"], (">", 90.0)),
            f"cross regime, D1_A buckets pooled: {row['acc']:.1f}% [{row['ci'][0]:.1f}, "
            f"{row['ci'][1]:.1f}] (n={n}) (paper: 100%)", n=n, width=STATS.widest([row["ci"]])))
    return out


def accuracy_figure(t2: dict, path) -> None:
    """Table 2's accuracy rows: ours (Wilson 95% CI) and the paper's, by depth."""
    plt = FG.pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for row, c in (("M_pure", "tab:blue"), ("M_spur", "tab:red")):
        cells = list(t2[row].values())
        m = [x["acc"] for x in cells]
        err = [[x["acc"] - x["ci"][0] for x in cells], [x["ci"][1] - x["acc"] for x in cells]]
        ax.errorbar([1, 2, 3], m, yerr=err, fmt="o-", color=c, label=f"{row} (ours)")
        ax.plot([1, 2, 3], PAPER_T2_ACC[row], "x--", color=c, alpha=0.6, label=f"{row} (paper)")
    ax.set_xticks([1, 2, 3])
    ax.set_xlabel("relational depth (D_pure, Mixed, form 0, d07)")
    ax.set_ylabel("accuracy (%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    FG.save_figure(fig, path)


__all__ = ["ACC_SEED", "T2_SEED", "T2_BUCKETS", "PAPER_T2_ACC", "sharded_predictions",
           "local_scenes", "acc_row", "run_regimes", "check_findings", "accuracy_figure"]
