"""``TrainConfig``: everything that defines a training run of a reference model."""

from __future__ import annotations

import dataclasses

from mmx_base.configs import check_ints, check_reals, config_from_dict
from mmx_base.errors import InputError
from gridvqa_jax.models import mdetr as M
from gridvqa_jax.world import universe as U


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run of a reference model (saved as train_config.json;
    ``--resume`` requires the same config). The schedule is the paper's two phases, see
    ``gridvqa_jax.training.train``'s module docstring."""

    variant: str = "pure"  # dataset variant trained on: "pure" -> M_pure, "spur" -> M_spur
    densities: tuple[str, ...] = ("d03", "d07")  # training densities, equal shares per batch
    batch_size: int = 64  # global batch (split evenly over densities and devices)
    steps: int = 6000  # total optimiser steps
    phase1_steps: int = 2000  # grounding-only steps before the QA phase
    lr: float = 8e-4  # peak learning rate
    warmup_steps: int = 300  # linear warm-up
    end_lr_frac: float = 0.02  # final lr = lr * end_lr_frac (cosine decay)
    weight_decay: float = 0.05  # AdamW decoupled weight decay
    clip_norm: float = 1.0  # global gradient-norm clip
    aux_weight: float = 1.0  # weight of the grounding losses during the QA phase
    qa_ramp_steps: int = 500  # QA loss weight rises linearly from 0 to 1 over these phase-2 steps
    max_answer_weight: float = 10.0  # clip of the inverse-frequency answer weights (x mean)
    freq_samples: int = 8192  # training samples used to measure answer frequencies
    hires_frac: float = 0.25  # share of images rendered at 64 px and downsampled
    data_seed: int = 1000  # training stream seeds: data_seed + density index
    init_seed: int = 0  # parameter initialisation
    save_every: int = 250  # checkpoint interval (steps)
    log_every: int = 25  # metrics.jsonl interval (steps)
    eval_every: int = 500  # held-out accuracy interval (steps); 0 = never
    eval_n: int = 512  # held-out samples per density at each evaluation
    # (bucket name, k): that bucket comes k times per round-robin cycle instead of once,
    # e.g. (("D3_CMP_F0", 8),) to drill the hardest bucket
    oversample: tuple[tuple[str, int], ...] = ()
    init_from: str = ""  # exported model directory to start from (same architecture); "" = random
    model: M.ModelConfig = M.ModelConfig()  # architecture

    def __post_init__(self):
        object.__setattr__(self, "densities", tuple(self.densities))
        check_ints(self, ("batch_size", "steps", "save_every", "log_every", "freq_samples"), 1)
        check_ints(self, ("phase1_steps", "warmup_steps", "qa_ramp_steps", "eval_every",
                          "eval_n"), 0)
        check_reals(self, ("lr", "clip_norm", "max_answer_weight"), positive=True)
        check_reals(self, ("weight_decay", "aux_weight", "end_lr_frac", "hires_frac"),
                    positive=False)
        if not 0.0 <= self.hires_frac <= 1.0:
            raise InputError(f"TrainConfig.hires_frac must lie in [0, 1], got {self.hires_frac!r}")
        if self.hires_frac > 0 and 64 % self.model.cell_px:
            raise InputError(f"TrainConfig.hires_frac > 0 area-averages 64-px cells down to "
                             f"model.cell_px, which must divide 64; got {self.model.cell_px} "
                             "(or set hires_frac = 0)")
        if not self.densities or any(k not in U.DENSITIES for k in self.densities):
            raise InputError(f"TrainConfig.densities must name one or more of "
                             f"{sorted(U.DENSITIES)}, got {self.densities!r}")
        if self.variant not in U.VARIANTS:
            raise InputError(f"TrainConfig.variant must be one of {U.VARIANTS}, got "
                             f"{self.variant!r}")
        if self.eval_every and self.eval_n < 1:
            raise InputError("TrainConfig.eval_n must be >= 1 when eval_every is set")
        names = {b.name for b in U.BUCKETS}
        for item in self.oversample:
            if len(item) != 2:
                raise ValueError(f"oversample entries are (bucket, factor) pairs, got {item!r}")
            name, k = item
            if name not in names:
                raise ValueError(f"oversample: unknown bucket {name!r}; known: "
                                 f"{', '.join(sorted(names))}")
            if not isinstance(k, int) or k < 1:
                raise ValueError(f"oversample: factor of {name} must be an integer >= 1, got {k!r}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        d = dict(d)
        d["model"] = M.ModelConfig.from_dict(d.get("model", {}))
        d["densities"] = tuple(d.get("densities", cls.densities))
        d["oversample"] = tuple((str(n), int(k)) for n, k in d.get("oversample", ()))
        return config_from_dict(cls, d, "train config")


__all__ = ["TrainConfig"]
