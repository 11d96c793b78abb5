"""Evaluation: answer parsing, the callable harness scored with rule-based fake VLMs that read
the rendered image, model scoring, export/load round trip and the CLI's JSON contract."""

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gridvqa_jax.training import export as EX
from reproduction.cli import gridvqa as gcli
from gridvqa_jax import evaluate as E
from gridvqa_jax.formats import official
from gridvqa_jax.world import render as R
from gridvqa_jax.training import train as T
from gridvqa_jax.world import universe as U
from gridvqa_jax.world import verify as V
from gridvqa_jax.models import mdetr as M


@pytest.mark.parametrize("text,yesno,want", [
    ("3", False, 3), ("There are 12 red circles.", False, 12), ("three", False, 3),
    ("I count Seven objects", False, 7), ("twenty-one", False, 21), ("none", False, 0),
    ("There are no such objects", False, 0), ("zero.", False, 0), ("Answer: 4", False, 4),
    ("Yes", True, 1), ("yes, there is one", True, 1), ("No.", True, 0),
    ("no, there are fewer", True, 0), ("True", True, 1), ("0", True, 0), ("2", True, 1),
    ("I cannot tell", False, None), ("maybe", True, None),
])
def test_parse_answer(text, yesno, want):
    assert E.parse_answer(text, yesno) == want


def rule_vlm(image, question):
    """A fake VLM: decodes the scene from pixels, parses the question text, applies the
    closed-world semantics, and answers in words ("three", "Yes, there is")."""
    color, shape = R.decode_image(image, 5)
    q = official.parse_question(question)
    b = U.BUCKETS[q["bucket"]]
    qd = {k: jnp.asarray(v) for k, v in q.items() if k != "bucket"}
    qd.update(n_clauses=b.n_clauses, is_cmp=b.qtype == "CMP", is_yesno=b.is_yesno)
    ans = int(V._question_answer(jnp.asarray(color.reshape(-1)), jnp.asarray(shape.reshape(-1)),
                                 qd, 5)["answer"])
    if b.is_yesno:
        return "Yes, there is." if ans else "No."
    words = list(E.NUMBER_WORDS)
    return f"I think the answer is {words[ans]}." if ans < 20 else str(ans)


def test_harness_with_rule_based_vlm():
    res = E.evaluate_callable(rule_vlm, "pure", n=40, densities=("d07",), progress=False)
    assert res["overall"] == 1.0 and res["unparsed"] == 0
    spec = U.Spec.feasible("pure", 5, 0.7)[0]
    assert set(res["buckets"]) <= {f"{U.BUCKETS[b].name}_d07" for b in spec.buckets}
    assert res["n"] == 40


def test_harness_with_blind_vlm_scores_the_answer_prior():
    sets = E.eval_sets("spur", 60, ("d03",))
    scenes = sets[0][0]
    res = E.evaluate_callable(lambda img, q: "yes" if q.startswith(("Is", "Are")) else "one",
                              "spur", n=60, densities=("d03",), progress=False)
    want = np.mean(np.where(scenes.is_yesno, scenes.answer == 1, scenes.answer == 1))
    assert abs(res["overall"] - want) < 1e-9
    assert res["unparsed"] == 0


def test_evaluate_model_with_constant_model_and_export_roundtrip(tmp_path):
    tiny = M.ModelConfig(d_model=32, n_heads=2, mlp_dim=64, enc_layers=1, dec_layers=1)
    params = M.init_params(tiny, jax.random.key(3))
    EX.export_model(tmp_path / "m", params, tiny, {"variant": "spur"})
    apply_fn, loaded, cfg = EX.load_model(tmp_path / "m")
    assert cfg == tiny
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(loaded)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    fn2, p2, cfg2 = EX.load_reference_model(str(tmp_path / "m"))
    assert cfg2 == tiny and EX.reference_spec(str(tmp_path / "m")).variant == "spur"

    def always_yes(p, image, tokens):
        logits = jnp.full((tokens.shape[0], 28), -10.0).at[:, 27].set(0.0)
        return {"answer_logprobs": logits}

    res = E.evaluate_model(always_yes, None, "pure", n=50, densities=("d07",), batch=16,
                           progress=False)
    scenes = E.eval_sets("pure", 50, ("d07",))[0][0]
    assert abs(res["overall"] - np.mean(scenes.is_yesno & (scenes.answer == 1))) < 1e-9
    assert res["n"] == 50

    # Corrupt parameters are refused with a clear message.
    (tmp_path / "m" / "params.msgpack").write_bytes(b"\x00garbage")
    with pytest.raises(ValueError, match="corrupt"):
        EX.load_model(tmp_path / "m")


def test_cli_evaluate_json_last_line(tmp_path, capsys):
    tiny = M.ModelConfig(d_model=32, n_heads=2, mlp_dim=64, enc_layers=1, dec_layers=1)
    EX.export_model(tmp_path / "m", M.init_params(tiny, jax.random.key(0)), tiny,
                   {"variant": "pure"})
    rc = gcli.main(["evaluate", "--model", str(tmp_path / "m"), "--data", "spur", "--n", "32",
                   "--density", "d07", "--cell-px", "16", "--json", "--quiet"])
    assert rc == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(last) == {"overall", "n", "buckets"} and last["n"] == 32
    assert all(0.0 <= v <= 1.0 for v in last["buckets"].values())
    assert all(k.endswith("_d07") and k.startswith("D") for k in last["buckets"])


FIXTURE = Path(__file__).resolve().parent / "fixtures" / "official_gridvqa"


def official_without_reports(tmp_path, folder: str) -> Path:
    """A copy of an official-generator fixture without its report CSVs: nothing records the
    variant (no spec.json either)."""
    out = shutil.copytree(FIXTURE / folder, tmp_path / folder)
    for csv in out.glob("*.csv"):
        csv.unlink()
    assert not (out / official.MANIFEST).exists()
    return out


def test_evaluate_official_folder_without_variant(tmp_path, capsys):
    """Accuracy does not depend on the variant: a folder that does not record it evaluates, and
    an always-"yes" model scores the share of "yes" answers in qa_val.jsonl."""
    root = official_without_reports(tmp_path, "spurious")
    qa = [json.loads(line) for line in open(root / "qa_val.jsonl")]
    want = np.mean([q["answer"] == "yes" for q in qa])

    def always_yes(p, image, tokens):
        return {"answer_logprobs": jnp.full((tokens.shape[0], 28), -10.0).at[:, 27].set(0.0)}

    res = E.evaluate_model(always_yes, None, str(root), n=0, batch=32, progress=False)
    assert res["n"] == len(qa) == 24
    assert abs(res["overall"] - want) < 1e-9

    tiny = M.ModelConfig(d_model=16, n_heads=2, mlp_dim=16, enc_layers=1, dec_layers=1)
    params = jax.eval_shape(lambda: M.init_params(tiny, jax.random.key(0)))  # no init compile
    params = jax.tree.map(lambda s: np.full(s.shape, 0.01, s.dtype), params)
    EX.export_model(tmp_path / "m", params, tiny, {"variant": "spur"})
    rc = gcli.main(["evaluate", "--model", str(tmp_path / "m"), "--data", str(root), "--n", "0",
                   "--cell-px", "16", "--batch", "32", "--json", "--quiet"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert json.loads(out.strip().splitlines()[-1])["n"] == 24


def test_eval_sets_names_an_unknown_density():
    from mmx_base.errors import InputError
    with pytest.raises(InputError, match="unknown density 'd7'.*d07"):
        E.eval_sets("pure", 4, ("d03", "d7"))
