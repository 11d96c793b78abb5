"""The shipped reference models: checkpoints/m_pure and m_spur load and answer a fresh sample of
their own variant (>= 99%), and M_spur's shortcut shows on D_pure (the pair is not swapped).

Fresh = generated here from a seed used by no training stream (training: 1000 + i, fine-tune
5000) and not the README's evaluation seed (777000). Images are rendered at the official 64 px
per cell (the models area-average them to their 16 px input), as ``gridvqa evaluate`` does.
Cost: one sampler compile per variant dominates (~15 s CPU each).
"""

import pytest

from gridvqa_jax.evaluate import evaluate_model
from gridvqa_jax.models.mdetr import ModelConfig
from gridvqa_jax.training.export import load_reference_model, reference_spec
from mmx_base.model import Model

FRESH_SEED = 4_242_000
N = 128  # d07 samples: ~7 per bucket; 99% allows one wrong answer


@pytest.fixture(scope="module", params=["pure", "spur"])
def reference(request):
    return request.param, load_reference_model(request.param)


def _accuracy(apply_fn, params, data):
    return evaluate_model(apply_fn, params, data, n=N, densities=("d07",), cell_px=64, batch=N,
                          seed=FRESH_SEED, progress=False)


def test_reference_model_answers_its_own_variant(reference):
    name, model = reference
    assert isinstance(model, Model) and isinstance(model.config, ModelConfig)
    apply_fn, params, cfg = model  # the Model contract unpacks as a triple
    assert cfg.grid_size == 5 and apply_fn is model.apply and params is model.params
    spec = reference_spec(name)
    assert spec.variant == name and spec.grid_size == cfg.grid_size
    res = _accuracy(apply_fn, params, name)
    assert res["n"] == N
    assert res["overall"] >= 0.99, res


def test_spur_model_takes_the_shortcut_on_pure_data():
    """M_spur counts attribute matches anywhere, which D_pure's confusers punish (README: 39.8%
    overall in the cross regime), while M_pure answers the same sample (previous test)."""
    apply_fn, params, _ = load_reference_model("spur")
    res = _accuracy(apply_fn, params, "pure")
    assert res["overall"] < 0.8, res


def test_models_of_one_architecture_share_one_jitted_apply():
    """M_pure and M_spur share one apply_fn object (``export.jitted_apply``), so every program
    jitted over it compiles once for both; their parameters differ."""
    import jax
    import numpy as np

    a = load_reference_model("pure")
    b = load_reference_model("spur")
    assert a[0] is b[0]
    assert not all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a[1]),
                                                        jax.tree.leaves(b[1])))
