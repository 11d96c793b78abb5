"""Training of the detectors on the closed-world benchmark or a real one (optax AdamW, Orbax
resume).

Data (``TrainConfig.data``, ``DATA_SOURCES``):

* ``closed_world``: step ``s`` trains on closed-world samples ``s * B .. s * B + B - 1`` of
  ``TRAIN_SEED`` (drawn from ``TrainConfig.world_spec()``).
* ``fakeddit`` / ``mmfakebench`` (``REAL_SOURCES``): the records of the file ``root``
  (``bias_jax.data.fakeddit`` / ``mmfakebench`` readers, images under ``image_dir`` or the
  reader's default) are split by the paper's protocol (``data.split.paper_splits``, seed
  ``split_seed``, stratified by label): training reads ``Finetune_train`` only, the held-out
  evaluation ``Finetune_valid`` (its first ``eval_n``), and the views analyse the rest
  (``Analysis_train``; ``analysis_records``). The binary real/fake label is the only target (no
  bias types exist for real data). The vocabulary is built from the ``Finetune_train`` texts
  (``Vocab.build``, at most ``max_vocab`` words) and the detector's ``vocab_size`` set to its
  size (``resolve_config``); the export stores it (``config.json``: ``"vocab"``, ``"data"``).
  Step ``s`` reads positions ``s * B .. s * B + B - 1`` of an endless stream of epochs, epoch
  ``e`` being a permutation of ``Finetune_train`` drawn from ``default_rng([split_seed, 2,
  e])`` (``real_positions``). The training and validation images are decoded once, at the
  detector's input size ``S * P`` (uint8, ``3 (S P)^2`` bytes per sample: 19 KB at the default
  80 px, so 1.6 GB for Fakeddit's 81k ``Finetune_train`` samples).

Text encoder (``DetectorConfig.text_encoder``): with ``minilm`` the closed-world claims are
re-tokenized into MiniLM WordPiece ids (``detectors.closed_world_text``, core words carried
over) and real texts are tokenized with MiniLM's tokenizer instead of a vocabulary built from
the data (``max_vocab`` unused; the export stores the encoder's ``"text_encoder"`` record,
``detectors.text_record``, instead of a ``"vocab"``).

Either way the data stream is a function of the step alone and a resumed run sees exactly the
batches an uninterrupted one would: resume after an interruption loses at most ``save_every``
steps and ends with the same parameters.

Loss: ``mean_b BCE(sigmoid(logit_b), label_b == REAL)``, plus for the detectors with cell
gates (joint, lvlm) ``aux_weight * mean_b sum_{i,k<2} BCE(gate_{b,i,k}, target_{b,k,i})``, the
grounding loss: gate 0 (1) should mark the cells holding the claim's first (second) named
object key (``grounding_targets``; none for "more than k objects"). Without it the label is a
conjunction of image and text features each independent of it (the benchmark is built that
way), and gradient descent sits on a long plateau at chance. The grounding loss needs the
closed world's scenes; it is off on real data, on the graded world and for the generic
architecture (``TrainConfig.grounded``). Optimiser:
``mmx_base.optim.make_optimizer`` (global-norm clipping, then AdamW with linear
warm-up and cosine decay). Each detector sees only its own modalities
(``detectors.detector_inputs``: the others are the absent inputs).

The loop is ``mmx_base.loop.run``, shared with the reference models: files under
``out`` are ``train_config.json``, ``ckpt/<step>/`` (Orbax ``CheckpointManager``, the last two
kept) and ``metrics.jsonl`` (one JSON object per ``log_every`` steps, and one per held-out
evaluation; repaired on resume); batches are sharded over a ``('data',)`` mesh, parameters
replicated; wall time counts across resumes; a non-finite loss stops the run with
``FloatingPointError`` naming the step and the last checkpoint; the final detector is exported
in the one export format (``mmx_base.export_format``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bias_jax import detectors as D
from bias_jax import evaluate as BE
from bias_jax.data import batch as BA
from bias_jax.data import closed_world as CW
from bias_jax.data import split as SPL
from bias_jax.data.batch import REAL, Batch, LoadReport, Record
from bias_jax.data.text import Vocab
from bias_jax.data.worlds import WORLDS  # closed worlds (TrainConfig.world)
from mmx_base.configs import check_ints, check_reals, config_from_dict
from mmx_base.errors import InputError
from mmx_base.trees import n_params
from mmx_base import loop as L
from mmx_base.export_format import CONFIG, check_export_target
from mmx_base.optim import make_optimizer
from mmx_base.mesh import data_mesh

REAL_SOURCES = ("fakeddit", "mmfakebench")  # real benchmarks: binary real/fake labels only
DATA_SOURCES = ("closed_world",) + REAL_SOURCES
ROOT_HELP = {"fakeddit": "the Fakeddit TSV, images in <its directory>/images/<id>.jpg",
             "mmfakebench": "the MMFakeBench dataset folder (e.g. MMFakeBench_val/, its JSON in "
                            "source/) or that JSON, image paths relative to the folder above "
                            "source/"}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """One training run (saved as ``train_config.json``; ``--resume`` requires it unchanged)."""

    detector: D.DetectorConfig = D.DetectorConfig()  # architecture
    data: str = "closed_world"  # data source (DATA_SOURCES)
    type_mix: tuple = (0.25, 0.5, 0.25)  # closed world: training mix of the three bias types
    p_real: tuple = (0.5, 0.5, 0.5)  # closed world: P(real | type) of the training mix (the
    #                                  shipped detectors' mixture: training reads labels only,
    #                                  and a real Uni-image sample is one more real authentic
    #                                  scene with a true claim; see closed_world)
    root: str = ""  # real data: Fakeddit TSV / MMFakeBench dataset folder or JSON (ROOT_HELP)
    image_dir: str = ""  # real data: image directory / root ("" = the reader's default)
    split_seed: int = 0  # real data: seed of the Finetune / Analysis split and the shuffle
    max_vocab: int = 20000  # real data: vocabulary cap (PAD and UNK included)
    steps: int = 2000  # optimisation steps
    batch_size: int = 64  # samples per step
    lr: float = 2e-3  # peak learning rate
    warmup: int = 100  # linear warm-up steps
    weight_decay: float = 1e-4  # AdamW decoupled weight decay
    clip: float = 1.0  # global gradient-norm clip
    init_seed: int = 0  # parameter initialisation key
    save_every: int = 250  # Orbax checkpoint interval (steps)
    log_every: int = 50  # metrics.jsonl interval (steps)
    eval_every: int = 0  # held-out per-type evaluation interval (0 = only at the end)
    eval_n: int = 1000  # held-out samples per evaluation (0 = none; real data: at most that
    #                     many of Finetune_valid)
    aux_weight: float = 0.2  # closed world, joint / lvlm: weight of the grounding loss
    # closed world drawn from (WORLDS): "basic" (closed_world, type_mix / p_real) or "graded"
    # (data.graded_world at its default case mix); "basic" is the default of a stored config
    # without the key (the runs and exports made before the graded world)
    world: str = "basic"
    # steps after which the parameters are also exported as a detector directory
    # (``train(..., snapshot_dir=D)``: ``D/steps_<s>``), with their held-out evaluation
    snapshot_steps: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "type_mix", tuple(float(x) for x in self.type_mix))
        object.__setattr__(self, "p_real", tuple(float(x) for x in self.p_real))
        object.__setattr__(self, "snapshot_steps", tuple(int(x) for x in self.snapshot_steps))
        if self.world not in WORLDS:
            raise InputError(f"unknown --world {self.world!r}; available: {WORLDS}")
        if any(not 1 <= s <= self.steps for s in self.snapshot_steps):
            raise InputError(f"TrainConfig.snapshot_steps must lie in 1..steps ({self.steps}), "
                             f"got {self.snapshot_steps!r}")
        for f in ("root", "image_dir"):  # a Path is stored as its string
            object.__setattr__(self, f, str(getattr(self, f) or ""))
        if self.data not in DATA_SOURCES:
            raise InputError(f"unknown --data {self.data!r}; available: {DATA_SOURCES}")
        if self.data in REAL_SOURCES and not self.root:
            raise InputError(f"--data {self.data} needs --root FILE ({ROOT_HELP[self.data]})")
        if self.data not in REAL_SOURCES and (self.root or self.image_dir):
            raise InputError(f"--root / --image-dir name a real dataset's files; --data "
                             f"{self.data} has none (real data: {', '.join(REAL_SOURCES)})")
        check_ints(self, ("steps", "batch_size", "save_every", "log_every"), 1)
        check_ints(self, ("warmup", "eval_every", "eval_n", "split_seed"), 0)
        check_ints(self, ("max_vocab",), 2)
        check_reals(self, ("lr", "clip"), positive=True)
        check_reals(self, ("weight_decay", "aux_weight"), positive=False)
        if (len(self.type_mix) != 3 or min(self.type_mix) < 0
                or abs(sum(self.type_mix) - 1.0) > 1e-6):  # as closed_world.WorldSpec
            raise InputError(f"TrainConfig.type_mix must be 3 non-negative shares summing to "
                             f"1, got {self.type_mix!r}")
        if len(self.p_real) != 3 or not all(0.0 <= q <= 1.0 for q in self.p_real):
            raise InputError(f"TrainConfig.p_real must be 3 probabilities (one per bias type), "
                             f"got {self.p_real!r}")

    @property
    def real(self) -> bool:
        """Whether the run trains on a real benchmark (``REAL_SOURCES``)."""
        return self.data in REAL_SOURCES

    @property
    def grounded(self) -> bool:
        """Whether the grounding loss is on: the basic closed world, a designed gated detector
        (joint, lvlm) and ``aux_weight > 0``. Off on real data (no scenes to ground the gates
        in), on the graded world (its detectors learn from labels only, as on real data) and
        for arch "generic" (no gates; label-only by design)."""
        return (not self.real and self.world == "basic" and self.detector.arch == "designed"
                and self.detector.kind in ("joint", "lvlm") and self.aux_weight > 0)

    def world_spec(self):
        """The spec training draws from: basic world a ``closed_world.WorldSpec`` with the
        detector's grid size, cell px and claim length, this run's ``type_mix`` and ``p_real``,
        every other field at its default; graded world a ``graded_world.GradedSpec`` with the
        detector's grid size, cell px and claim length, every other field (the case mix) at its
        default."""
        d = self.detector
        if self.world == "graded":
            from bias_jax.data import graded_world as GW

            return GW.GradedSpec(grid_size=d.grid_size, cell_px=d.cell_px,
                                 max_tokens=d.max_tokens)
        return CW.WorldSpec(grid_size=d.grid_size, cell_px=d.cell_px, type_mix=self.type_mix,
                            p_real=self.p_real, max_tokens=d.max_tokens)

    def to_dict(self) -> dict:
        """JSON-ready dict of every field (``detector`` nested as a dict, ``type_mix`` and
        ``p_real`` lists)."""
        doc = dataclasses.asdict(self)
        doc["type_mix"], doc["p_real"] = list(self.type_mix), list(self.p_real)
        doc["snapshot_steps"] = list(self.snapshot_steps)
        return doc

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        """Inverse of ``to_dict``; unknown keys raise ValueError, missing ones take defaults."""
        d = dict(d)
        d["detector"] = D.DetectorConfig.from_json(d.get("detector", {}))
        d["type_mix"] = tuple(d.get("type_mix", cls.type_mix))
        d["p_real"] = tuple(d.get("p_real", cls.p_real))
        d["snapshot_steps"] = tuple(d.get("snapshot_steps", cls.snapshot_steps))
        return config_from_dict(cls, d, "train config")

    to_json, from_json = to_dict, from_dict  # the names DetectorConfig uses


def optimizer(cfg: TrainConfig):
    """``optim.make_optimizer`` with the run's settings (end learning rate ``0.02 * lr``):
    (optax transform, lr schedule)."""
    return _optimizer(*_opt_args(cfg))


def _opt_args(cfg: TrainConfig) -> tuple:
    return cfg.lr, cfg.steps, cfg.warmup, cfg.weight_decay, cfg.clip


def _optimizer(lr, steps, warmup, weight_decay, clip):
    return make_optimizer(lr=lr, steps=steps, warmup_steps=warmup, weight_decay=weight_decay,
                          clip_norm=clip, end_lr_frac=0.02)


def init_state(cfg: TrainConfig, mesh=None) -> dict:
    """``{"params", "opt_state"}`` at step 0 (a pure function of ``cfg.init_seed``), replicated
    over ``mesh`` (default: all devices)."""
    params = D.init_params(cfg.detector, jax.random.key(cfg.init_seed))
    opt, _ = optimizer(cfg)
    return L.replicate({"params": params, "opt_state": opt.init(params)},
                       data_mesh() if mesh is None else mesh)


def grounding_targets(samples: CW.WorldSample) -> np.ndarray:
    """bool [B, 2, C]: cells holding the shown claim's first / second named object key.

    Relation and comparison claims name X then Y; the self claims name one key twice; "there
    are more than k objects" names none (all False). Read from the underlying scene."""
    lat = samples.latents
    color, shape = np.asarray(samples.color), np.asarray(samples.shape)
    BA = color.shape[0]
    keys = np.where(color >= 0, 4 * color + shape, -1).reshape(BA, -1)
    fam = np.asarray(lat.family)
    none = np.full(BA, -2)
    kx = np.where(fam <= CW.F_COMPARISON, lat.key_x,
                  np.where(fam == CW.F_COUNT, none, lat.ut_key))
    ky = np.where(fam <= CW.F_COMPARISON, lat.key_y,
                  np.where(fam == CW.F_COUNT, none, lat.ut_key))
    return np.stack([keys == kx[:, None], keys == ky[:, None]], axis=1)


def loss_fn(cfg: TrainConfig, params, image, tokens, label, ground):
    """Classification BCE (+ ``aux_weight`` x grounding BCE when ``cfg.grounded``); returns
    (loss, (classification loss, accuracy, grounding loss))."""
    return _loss(cfg.detector, cfg.aux_weight if cfg.grounded else 0.0, params, image, tokens,
                 label, ground)


def _loss(det: D.DetectorConfig, aux_weight: float, params, image, tokens, label, ground):
    y = (label == REAL).astype(jnp.float32)
    if aux_weight > 0:
        logits, gates = D.apply_with_gates(det, params, image, tokens)  # gates [B, C, m]
        target = jnp.transpose(ground, (0, 2, 1)).astype(jnp.float32)  # [B, C, 2]
        aux = optax.sigmoid_binary_cross_entropy(gates[..., :2], target).sum(axis=(1, 2)).mean()
    else:
        logits = D.make_apply(det)(params, image, tokens)
        aux = jnp.float32(0.0)
    cls = optax.sigmoid_binary_cross_entropy(logits, y).mean()
    acc = ((logits > 0) == (y > 0.5)).mean()
    return cls + aux_weight * aux, (cls, acc, aux)


def make_step(cfg: TrainConfig, mesh=None):
    """Jitted ``step(state, image, tokens, label, ground) -> (state, metrics)`` over ``mesh``
    (default: all devices; state donated, outputs replicated: ``loop.jit_step``). Memoized on
    what the step computes (the detector, the grounding weight, the optimiser settings, the
    mesh), so runs that differ only in data, seeds or logging share one compiled program."""
    return _make_step(cfg.detector, cfg.aux_weight if cfg.grounded else 0.0, _opt_args(cfg),
                      data_mesh() if mesh is None else mesh)


@functools.lru_cache(maxsize=16)
def _make_step(det: D.DetectorConfig, aux_weight: float, opt_args: tuple, mesh):
    opt, _ = _optimizer(*opt_args)

    def step(state, image, tokens, label, ground):
        (loss, (cls, acc, aux)), grads = jax.value_and_grad(
            lambda p: _loss(det, aux_weight, p, image, tokens, label, ground),
            has_aux=True)(state["params"])
        updates, opt_state = opt.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return ({"params": params, "opt_state": opt_state},
                {"loss": loss, "cls_loss": cls, "acc": acc, "ground_loss": aux,
                 "grad_norm": optax.tree.norm(grads)})

    return L.jit_step(step, mesh)


def make_batch(cfg: TrainConfig, step: int, spec=None):
    """(image, tokens, label, grounding targets [B, 2, C]) of training step ``step`` (host
    numpy; the modalities the detector does not read are absent). Graded world: samples
    ``step * B ..`` of ``TRAIN_SEED`` (``graded_world.load_graded_world``), grounding targets
    all False (never read: the grounding loss is off there)."""
    spec = cfg.world_spec() if spec is None else spec
    start = step * cfg.batch_size
    if cfg.world == "graded":
        from bias_jax.data import graded_world as GW

        b = BA.to_numpy(GW.load_graded_world(spec, BE.TRAIN_SEED, cfg.batch_size, start=start))
        b = D.closed_world_text(cfg.detector, b)
        image, tokens = D.detector_inputs(cfg.detector.kind, b)
        C = cfg.detector.grid_size ** 2
        return image, tokens, b.label, np.zeros((cfg.batch_size, 2, C), bool)
    s = CW.generate(spec, BE.TRAIN_SEED, start, cfg.batch_size)
    b = BA.to_numpy(CW.to_batch(s, spec, np.arange(start, start + cfg.batch_size)))
    b = D.closed_world_text(cfg.detector, b)  # MiniLM detectors: claims as WordPiece ids
    image, tokens = D.detector_inputs(cfg.detector.kind, b)
    return image, tokens, b.label, grounding_targets(jax.device_get(s))


# ----------------------------------------------------------------------------------------------
# Real benchmarks (binary labels only).
# ----------------------------------------------------------------------------------------------
TEXT_KINDS = ("text", "joint", "lvlm")  # detectors that read the tokens (so share a vocabulary)


def read_real(source: str, path, image_dir=None, *,
              check_images: bool = True) -> tuple[list[Record], LoadReport]:
    """Records and skip report of a real benchmark file: ``fakeddit.read_fakeddit`` or
    ``mmfakebench.read_mmfakebench`` (``image_dir`` None / "": the reader's default).
    ``ValueError`` when no usable record remains (naming the skip reasons)."""
    from bias_jax.data import fakeddit, mmfakebench

    if source not in REAL_SOURCES:
        raise InputError(f"unknown real data source {source!r}; available: {REAL_SOURCES}")
    read = {"fakeddit": fakeddit.read_fakeddit, "mmfakebench": mmfakebench.read_mmfakebench}
    records, report = read[source](path, image_dir or None, check_images=check_images)
    if not records:
        raise ValueError(f"{path}: no usable {source} samples (skipped: {report.skipped}; "
                         f"first: {'; '.join(report.examples[:3])})")
    return records, report


def fingerprint(records) -> str:
    """sha256 (hex) of the records' ``(uid, label, text)`` in order: names the dataset a
    detector was trained on, so the analysis can leave out its fine-tuning samples (the image
    bytes are not read)."""
    h = hashlib.sha256()
    for r in records:
        h.update(json.dumps([r.uid, int(r.label), r.text]).encode("utf-8") + b"\n")
    return h.hexdigest()


def real_splits(records, seed: int) -> dict[str, np.ndarray]:
    """``split.paper_splits`` of the records (the file is the Train set), stratified by the
    binary label: index arrays ``Finetune_train`` / ``Finetune_valid`` / ``Analysis_train``."""
    return SPL.paper_splits(len(records), seed=seed,
                           labels=np.asarray([r.label for r in records]))


@dataclasses.dataclass(frozen=True)
class RealData:
    """A real benchmark prepared for training (``prepare_real``)."""

    source: str  # REAL_SOURCES
    path: str  # the dataset file
    split_seed: int  # seed of ``splits``
    records: tuple  # every usable Record of the file, in file order
    report: LoadReport  # what the reader skipped
    splits: dict  # real_splits(records, split_seed): index arrays into records
    vocab: object  # Vocab built from the Finetune_train texts, or MiniLM's PieceTokenizer
    fingerprint: str  # fingerprint(records)

    def meta(self) -> dict:
        """JSON-ready description stored in an export's ``config.json`` under ``"data"``."""
        return {"source": self.source, "root": self.path, "split_seed": self.split_seed,
                "n_records": len(self.records), "fingerprint": self.fingerprint,
                "splits": {k: int(len(v)) for k, v in self.splits.items()},
                "skipped": dict(self.report.skipped)}


def prepare_real(cfg: TrainConfig) -> RealData:
    """Read ``cfg.root`` (``read_real``), split it (``real_splits``) and build the vocabulary
    from the ``Finetune_train`` texts (at most ``cfg.max_vocab`` words; a ``minilm`` detector
    takes MiniLM's WordPiece tokenizer instead, no vocabulary). ``ValueError`` when the split
    leaves nothing to train on (fewer than 2 usable samples)."""
    records, report = read_real(cfg.data, cfg.root, cfg.image_dir)
    splits = real_splits(records, cfg.split_seed)
    if not len(splits["Finetune_train"]):
        raise ValueError(f"{cfg.root}: {len(records)} usable {cfg.data} sample(s) leave none "
                         f"to fine-tune on (the paper's split trains on 40% of them)")
    if cfg.detector.text_encoder == "minilm":
        vocab = D.text_tokenizer(cfg.detector)
    else:
        vocab = Vocab.build((records[i].text for i in splits["Finetune_train"]),
                            max_size=cfg.max_vocab)
    return RealData(cfg.data, cfg.root, cfg.split_seed, tuple(records), report, splits, vocab,
                    fingerprint(records))


def resolve_config(cfg: TrainConfig, data: RealData | None) -> TrainConfig:
    """``cfg`` as trained: on real data the detector's ``vocab_size`` is the vocabulary's size
    (closed world: unchanged)."""
    if data is None:
        return cfg
    det = dataclasses.replace(cfg.detector, vocab_size=len(data.vocab))
    return dataclasses.replace(cfg, detector=det)


def real_batch(cfg: TrainConfig, data: RealData, idx) -> Batch:
    """The records ``idx`` (indices into ``data.records``) decoded at the detector's input
    size ``S * P`` and tokenized with ``data.vocab`` to ``max_tokens`` (host ``Batch``)."""
    d = cfg.detector
    return BA.records_to_batch([data.records[i] for i in idx], data.vocab,
                              image_size=d.grid_size * d.cell_px, max_len=d.max_tokens)


@functools.lru_cache(maxsize=4)
def _epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, 2, epoch]).permutation(n)


def real_positions(n: int, step: int, batch_size: int, seed: int) -> np.ndarray:
    """int64 [batch_size]: the training samples (indices into the n ``Finetune_train``
    samples) of step ``step``: positions ``p = step * B + b`` of an endless stream whose epoch
    ``e = p // n`` is ``default_rng([seed, 2, e]).permutation(n)``."""
    if n < 1:
        raise ValueError(f"no training samples (n={n})")
    p = step * batch_size + np.arange(batch_size)
    return np.asarray([_epoch_order(n, seed, int(q // n))[q % n] for q in p], np.int64)


def make_real_batch(cfg: TrainConfig, step: int, train_set: Batch):
    """(image, tokens, label, grounding targets [B, 2, C] all False) of training step ``step``
    on real data, ``train_set`` being the decoded ``Finetune_train`` samples (host numpy; the
    modalities the detector does not read are absent)."""
    b = BA.take(train_set, real_positions(train_set.size, step, cfg.batch_size, cfg.split_seed))
    image, tokens = D.detector_inputs(cfg.detector.kind, b)
    ground = np.zeros((cfg.batch_size, 2, cfg.detector.n_cells), bool)
    return np.asarray(image), np.asarray(tokens), b.label, ground


def accuracy_by_label(logits, labels) -> dict:
    """``{"overall", "real", "fake"}``: accuracy of ``logits > 0`` (predict real) over all
    samples and over the real / fake ones (NaN for a class with no samples)."""
    labels = np.asarray(labels)
    correct = (np.asarray(logits) > 0) == (labels == REAL)
    out = {"overall": float(correct.mean())}
    for name, sel in (("real", labels == REAL), ("fake", labels != REAL)):
        out[name] = float(correct[sel].mean()) if sel.any() else float("nan")
    return out


def _export_doc(path) -> dict:
    """The ``config.json`` object of the export directory ``path`` (``ValueError`` naming the
    file when it is missing or not JSON)."""
    f = Path(path) / CONFIG
    if not f.is_file():
        raise InputError(f"{path} is not an exported detector (no {CONFIG})")
    try:
        return json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{f}: corrupt detector config, not JSON ({e})") from None


def export_tokenizer(root, docs: dict, source: str):
    """The tokenizer the text-reading detectors (text, joint, lvlm) under ``root`` share, from
    their ``config.json`` objects ``docs`` (kind -> dict): MiniLM's ``PieceTokenizer`` when they
    read text with ``minilm`` (vocabulary-free, so detectors trained on the closed world apply;
    ``ExportError`` when the package is missing or its weights are not the recorded ones), else
    the real-data ``Vocab`` stored in the exports. ``InputError`` when they use different
    text encoders or vocabularies, or a learned detector has no real-data vocabulary."""
    root = Path(root)
    cfgs = {k: D.DetectorConfig.from_json(docs[k]["detector"]) for k in TEXT_KINDS}
    encoders = {k: c.text_encoder for k, c in cfgs.items()}
    if len(set(encoders.values())) > 1:
        raise InputError(f"the text, joint and lvlm detectors under {root} read text with "
                         f"different encoders ({encoders}); train them with the same "
                         "--text-encoder")
    if encoders["joint"] == "minilm":
        for k, c in cfgs.items():
            D.check_text_encoder(c, docs[k], root / D.SHIPPED[k])
        return D.text_tokenizer(cfgs["joint"])
    vocabs = {}
    for k in TEXT_KINDS:
        if not isinstance(docs[k].get("vocab"), list):
            raise InputError(
                f"{root / D.SHIPPED[k]} holds no real-data vocabulary (trained on "
                f"{docs[k].get('train', {}).get('data', 'closed_world')!r}); train it on "
                f"{source} first: modality-bias train --detector {k} --data {source} --root "
                f"FILE --export {root / D.SHIPPED[k]} (or use --text-encoder minilm, which "
                "needs no vocabulary)")
        vocabs[k] = Vocab(tuple(docs[k]["vocab"]))
    if len({v.words for v in vocabs.values()}) > 1:
        raise InputError(f"the text, joint and lvlm detectors under {root} were trained with "
                         f"different vocabularies (sizes {[len(v) for v in vocabs.values()]}); "
                         "train them on the same file with the same --split-seed")
    return vocabs["joint"]


def data_file(source: str, path) -> str:
    """The file a real dataset's ``--root`` names: the TSV itself, or MMFakeBench's JSON
    (``mmfakebench.locate``: the dataset folder's ``source/*.json``, or the JSON given)."""
    if source == "mmfakebench":
        from bias_jax.data import mmfakebench

        return mmfakebench.locate(path)[0]
    return os.fspath(path)


def _same_file(a, b) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them is gone: not provably the same
        return False


def export_image_dir(docs: dict, source: str, path, where="") -> str | None:
    """The ``--image-dir`` the detectors (``docs``: kind -> ``config.json`` object) were
    trained with on the data file ``path`` names (``config.json`` ``"train"`` -> ``"data"``,
    ``"root"``, ``"image_dir"``), or None: no detector was trained on that file, or they used
    the reader's default. ``InputError`` when they disagree, or when the recorded directory is
    not one here (``where``: the detectors' root, for the message)."""
    target = data_file(source, path)
    found = {}
    for kind, doc in docs.items():
        train_doc = doc.get("train")
        if not (isinstance(train_doc, dict) and train_doc.get("data") == source
                and train_doc.get("root")):
            continue
        try:
            trained_on = data_file(source, train_doc["root"])
        except (OSError, ValueError):  # the recorded root is gone or no longer a dataset
            continue
        if _same_file(trained_on, target):
            found.setdefault(str(train_doc.get("image_dir") or ""), []).append(kind)
    if len(found) > 1:
        raise InputError(f"the detectors under {where} were trained on {path} with different "
                         f"--image-dir ({found}); pass --image-dir")
    image_dir = next(iter(found), "")
    if image_dir and not os.path.isdir(image_dir):
        raise InputError(f"the detectors under {where} were trained on {path} with --image-dir "
                         f"{image_dir}, which is not a directory here; pass --image-dir")
    return image_dir or None


def analysis_records(source: str, path, detectors_root, *, image_dir=None,
                     n: int | None = None) -> tuple[list[Record], dict]:
    """The real-benchmark samples the views analyse with the detectors exported under
    ``detectors_root`` (``bias_<kind>/``, as ``train`` writes them with ``--export``), chosen
    before any image is decoded: the records of ``path`` (``read_real``), less the
    fine-tuning split, then the first ``n`` (None: all) in file order.

    When ``path`` is the file a detector was trained on (same ``fingerprint``), the samples of
    its fine-tuning split (``Finetune_train`` / ``Finetune_valid`` of its ``split_seed``) are
    left out, so the views analyse the paper's ``Analysis_train`` part; any other file is
    analysed whole. Images are read under ``image_dir``; None: the one the detectors were
    trained with on this file (``export_image_dir``), else the reader's default.

    Returns ``(records, info)``: ``info = {"n_records", "n_available", "n_analysed",
    "left_out_finetune", "vocab_size", "ids", "batching"}``: the file's usable records, those
    outside the fine-tuning split, those returned (``n_available`` cut to ``n``), those left
    out as fine-tuning samples, the tokenizer's size, the returned records' ``Record.uid`` in
    order (the ids human labels name) and the keyword arguments that decode them as the
    detectors read them, ``{"vocab", "image_size", "max_len"}`` for
    ``batch.iter_batches(records, chunk=..., **info["batching"])`` or ``records_to_batch``:
    the vocabulary the text-reading detectors (text, joint, lvlm) were trained with (stored in
    their exports; they must agree) or MiniLM's tokenizer for ``minilm`` detectors
    (``export_tokenizer``), the joint detector's ``S * P`` and ``max_tokens``. ``InputError``
    for detectors without a real-data vocabulary (trained on the closed world) or with
    different vocabularies or claim lengths; ``ValueError`` when the fine-tuning split leaves
    nothing."""
    root = Path(detectors_root)
    docs = {k: _export_doc(root / D.SHIPPED[k]) for k in D.KINDS}
    vocab = export_tokenizer(root, docs, source)
    cfgs = {k: D.DetectorConfig.from_json(docs[k]["detector"]) for k in TEXT_KINDS}
    lengths = {k: c.max_tokens for k, c in cfgs.items()}
    if len(set(lengths.values())) > 1:
        raise InputError(f"the detectors under {root} read different claim lengths "
                         f"(max_tokens {lengths}); train them with the same --max-tokens")
    cfg = cfgs["joint"]
    image_dir = image_dir or export_image_dir(docs, source, path, root)
    records, _ = read_real(source, path, image_dir)
    keep = np.ones(len(records), bool)
    fp = fingerprint(records)
    for doc in docs.values():
        meta = doc.get("data")
        if isinstance(meta, dict) and meta.get("fingerprint") == fp:
            s = real_splits(records, int(meta.get("split_seed", 0)))
            keep[s["Finetune_train"]] = keep[s["Finetune_valid"]] = False
    if not keep.any():
        raise ValueError(f"{path}: every sample was used to fine-tune the detectors under "
                         f"{root}; nothing is left to analyse")
    kept = [r for r, k in zip(records, keep) if k]
    available = len(kept)
    if n is not None:
        kept = kept[:n]
    return kept, {"n_records": len(records), "n_available": available,
                  "n_analysed": len(kept), "left_out_finetune": int((~keep).sum()),
                  "vocab_size": len(vocab), "ids": [r.uid for r in kept],
                  "batching": {"vocab": vocab, "image_size": cfg.grid_size * cfg.cell_px,
                               "max_len": cfg.max_tokens}}


def analysis_batch(source: str, path, detectors_root, *, image_dir=None) -> tuple[Batch, dict]:
    """Every sample of ``analysis_records(source, path, detectors_root, image_dir=image_dir)``
    decoded into one host ``Batch`` (``3 (S P)^2`` bytes of pixels per sample: use
    ``batch.iter_batches`` on the records for a large file). Returns ``(batch, info)`` with
    ``info = {"n_records", "n_analysed", "left_out_finetune", "vocab_size", "ids"}`` (as
    ``analysis_records``)."""
    records, info = analysis_records(source, path, detectors_root, image_dir=image_dir)
    batching = info.pop("batching")
    info.pop("n_available")
    return BA.records_to_batch(records, **batching), info


def train(cfg: TrainConfig, out, *, resume: bool = False, export=None, progress: bool = True,
          stop_after: int | None = None, log=print, mesh=None, overwrite: bool = False,
          snapshot_dir=None) -> dict:
    """Run or resume training (``loop.run``); returns ``{"out", "steps_done", "wall_s", "last",
    "eval", "params"}`` (+ ``"data"``: ``RealData.meta()`` on real data). ``stop_after`` ends
    the run after that step (saving there), as if killed at a save boundary. ``export`` (a
    directory) receives ``params.msgpack`` + ``config.json`` (``{"detector", "train",
    "summary"}``, on real data also ``"data"`` and ``"vocab"``: the word list) when the run
    completes; an existing export there is replaced only with ``overwrite=True``. ``mesh``: a
    ``('data',)`` mesh (default: all devices); ``batch_size`` must split evenly over it.

    ``eval``: closed world ``evaluate.evaluate_world`` (per bias type, and per case on the
    graded world) on ``eval_n`` fresh samples; real data ``accuracy_by_label`` on the first
    ``eval_n`` ``Finetune_valid``
    samples (None when there are none). On real data the saved ``train_config.json`` holds
    the resolved config (``resolve_config``: the vocabulary's size).

    ``snapshot_dir``: after each of ``cfg.snapshot_steps`` the parameters are exported to
    ``snapshot_dir/steps_<s>`` (``{"detector", "train", "snapshot": {"steps": s, "eval":
    ...}}``, the eval as above on ``eval_n`` held-out samples, ``evaluate.evaluate_world``
    per type and per case on the graded world); a snapshot already there (a resumed run) is
    kept."""
    mesh = data_mesh() if mesh is None else mesh
    if cfg.detector.uses_minilm:
        from bias_jax import minilm

        if not minilm.available():  # before anything is written
            raise InputError(f"--text-encoder minilm: the MiniLM weights are not installed: "
                             f"{minilm.INSTALL}")
    data = train_set = valid_set = None
    if cfg.real:
        if export is not None:
            check_export_target(export, overwrite)  # before reading the data
        L.check_batch_split(cfg.batch_size, mesh)
        data = prepare_real(cfg)
        cfg = resolve_config(cfg, data)
        log(f"{cfg.data}: {len(data.records)} usable of {data.report.n_rows} rows "
            f"(skipped {data.report.skipped or 'none'}); "
            + ", ".join(f"{k} {len(v)}" for k, v in data.splits.items() if len(v))
            + (f"; vocabulary {len(data.vocab)} words" if isinstance(data.vocab, Vocab)
               else "; MiniLM WordPiece tokenizer"))
        train_set = real_batch(cfg, data, data.splits["Finetune_train"])
        valid_idx = data.splits["Finetune_valid"][: cfg.eval_n]
        valid_set = real_batch(cfg, data, valid_idx) if len(valid_idx) else None
    spec = None if cfg.real else cfg.world_spec()
    step_fn = make_step(cfg, mesh)
    apply_fn = D.jitted_apply(cfg.detector)
    final = {}

    def advance(state, step):
        batch = (make_real_batch(cfg, step, train_set) if cfg.real
                 else make_batch(cfg, step, spec))
        return step_fn(state, *L.shard_batch(batch, mesh))

    def evaluate(state, done):
        if snapshot_dir is not None and done in cfg.snapshot_steps:
            snapshot(state, done)
        if not cfg.eval_n or not ((cfg.eval_every and done % cfg.eval_every == 0)
                                  or done == cfg.steps):
            return None
        if cfg.real:
            if valid_set is None:
                return None
            logits = BE.predict(apply_fn, state["params"], cfg.detector.kind, valid_set)
            res = accuracy_by_label(logits, valid_set.label)
        else:
            res = held_out(state)
        log(f"step {done}: held-out accuracy " + ", ".join(f"{k} {v:.3f}" for k, v in res.items()))
        if done == cfg.steps:
            final["eval"] = res
        return {"eval": res}

    def held_out(state):
        return BE.evaluate_world(apply_fn, state["params"], cfg.detector, world=cfg.world,
                                 n=cfg.eval_n, spec=spec if cfg.world == "graded" else None)

    def snapshot(state, done):
        path = Path(snapshot_dir) / f"steps_{done}"
        if (path / CONFIG).is_file():
            return
        res = held_out(state) if cfg.eval_n and not cfg.real else None
        D.export_detector(path, jax.device_get(state["params"]), cfg.detector,
                          {"train": cfg.to_dict(), "snapshot": {"steps": done, "eval": res}})
        log(f"step {done}: snapshot {path}" + (
            "; held-out " + ", ".join(f"{k} {v:.3f}" for k, v in res.items()) if res else ""))

    what = (f"{cfg.data} samples ({train_set.size} in Finetune_train)" if cfg.real
            else f"{cfg.world} closed-world samples")
    extra = {"data": data.meta()} if cfg.real else {}
    state, summary = L.run(
        cfg, out, init_state=lambda: init_state(cfg, mesh), advance=advance, resume=resume,
        stop_after=stop_after, progress=progress, log=log, desc=f"train {cfg.detector.kind}",
        intro=lambda st: (f"{cfg.detector.kind} detector: {n_params(st['params']):,} "
                          f"parameters; {cfg.steps} steps of {cfg.batch_size} {what}, "
                          f"{mesh.devices.size} device(s)"),
        evaluate=evaluate, summarize=lambda s: {**s, "eval": final.get("eval"), **extra},
        export=export, overwrite=overwrite,
        export_config=lambda s: {"detector": cfg.detector.to_json(), "train": cfg.to_dict(),
                                 "summary": s, **D.text_record(cfg.detector),
                                 **({"data": data.meta()} if cfg.real else {}),
                                 **({"vocab": list(data.vocab.words)}
                                    if cfg.real and isinstance(data.vocab, Vocab) else {})},
        prepare=lambda: L.check_batch_split(cfg.batch_size, mesh))
    return {**summary, "params": state["params"]}


__all__ = ["TrainConfig", "DATA_SOURCES", "REAL_SOURCES", "TEXT_KINDS", "optimizer",
           "init_state", "loss_fn", "make_step", "make_batch", "grounding_targets", "read_real",
           "fingerprint", "real_splits", "RealData", "prepare_real", "resolve_config",
           "real_batch", "real_positions", "make_real_batch", "accuracy_by_label",
           "export_tokenizer", "data_file", "export_image_dir", "analysis_records",
           "analysis_batch", "train"]
