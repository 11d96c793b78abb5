"""The error of permutation Shapley at equal budget, over many keys, on the bench's game.

``gridvqa bench explainers`` reports ``shapley_mae`` for one key: the mean absolute error of
``shapley.permutation_shapley`` against exact enumeration on a 12-player restriction of one real
sample (8 cells and 4 tokens of held-out pure sample 0, M_pure; ``bench_explainers._restriction``)
at ``--budget`` evaluations. One key's MAE is one draw of a spread; this prints the MAE's mean and
standard deviation over ``--keys`` keys (``split(key(--seed), --keys)``), the bench's own key's
MAE, and the largest |mean estimate - exact| over players against its standard error (an
unbiased estimator keeps it within a few). docs/results.md compares the draws with it.

    python experiments/permutation_error.py [--keys 400] [--budget 1000] [--seed 0]

Prints one line of text and, last, a JSON line.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

from gridvqa_jax.explain import perturb as PT
from gridvqa_jax.explain import shapley as SH
from gridvqa_jax.training.export import load_reference_model
from gridvqa_jax.world import render as R
from gridvqa_jax.world.scene import trim_tokens
from reproduction import bench_explainers as BE
from reproduction import table1 as T1


def bench_game():
    """The bench's 12-player table game ``(value_fn, m, exact phi [m])`` (its sample 0)."""
    model = load_reference_model("pure")
    scenes = trim_tokens(T1.regime_scenes("pure", 8, BE.BENCH_SEED))
    S = int(scenes.color.shape[-1])
    image = R.render(jnp.asarray(scenes.color[0]), jnp.asarray(scenes.shape[0]), 16)
    fm = PT.players(jax.tree.map(lambda a: a[0], scenes))
    value_fn = PT.make_value_fn(model.apply, model.params, image, jnp.asarray(scenes.tokens[0]),
                                fm, cell_px=16)
    v12, na, nb = BE._restriction(value_fn, jax.tree.map(lambda a: np.asarray(a)[0], scenes), S)
    m = na + nb
    game = BE._table_game(SH.all_coalition_values(v12, m, chunk=64), m)
    return game, m, np.asarray(SH.exact_shapley(game, m))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=400)
    ap.add_argument("--budget", type=int, default=1000, help="evaluations per estimate")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.keys < 2:
        ap.error(f"--keys must be >= 2 (a spread), got {args.keys}")
    game, m, phi = bench_game()
    n_perm = max(2, 2 * round((args.budget - 2) / (m - 1) / 2))  # as the bench's
    run = jax.jit(jax.vmap(lambda k: SH.permutation_shapley(game, m, k, n_perm)))
    est = np.asarray(run(jax.random.split(jax.random.key(args.seed), args.keys)), np.float64)
    mae = np.abs(est - phi).mean(axis=1)
    bench_key = np.asarray(SH.permutation_shapley(game, m, jax.random.key(2), n_perm))
    se = est.std(axis=0, ddof=1) / np.sqrt(args.keys)
    bias = np.abs(est.mean(axis=0) - phi)
    res = {"players": m, "permutations": n_perm, "keys": args.keys,
           "evaluations": SH.permutation_shapley_evaluations(m, n_perm),
           "mae_mean": float(mae.mean()), "mae_sd": float(mae.std(ddof=1)),
           "mae_bench_key": float(np.abs(bench_key - phi).mean()),
           "max_bias_in_se": float((bias / se).max()), "mae_of_zero": float(np.abs(phi).mean())}
    print(f"{m} players, {n_perm} permutations ({res['evaluations']} evaluations): MAE "
          f"{res['mae_mean']:.3f} (sd {res['mae_sd']:.3f}) over {args.keys} keys, the bench's "
          f"key {res['mae_bench_key']:.3f}; the zero estimate {res['mae_of_zero']:.3f}; "
          f"largest |mean - exact| {res['max_bias_in_se']:.1f} standard errors")
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
