"""Memory and speed of ``modality-bias analyze`` on real data of growing size (issue 24, "Any
size"): a generated folder in Fakeddit's released format, analysed whole, decoding included.

    python experiments/bias_stream_bench.py --dir /tmp/fakeddit_bench [--images 50000]
        [--n 5000 50000] [--chunk 256] [--json out.json]

1. ``--dir``/``train.tsv`` (pandas' layout: an unnamed index column first, the columns
   ``bias_jax.data.fakeddit`` requires, every other row real) and ``--dir``/``images/<id>.jpg``
   (``--images`` JPEGs of 64-80 px, colour blocks plus noise, written with Pillow; kept and
   reused when the folder already holds that many rows).
2. ``--dir``/``dets/bias_<kind>/``: the four detectors at their default sizes (80 px input,
   12 tokens), initialised at random (``detectors.init_params``, seed 0) and exported with the
   file's vocabulary as ``train --export`` writes them, but naming no training file, so
   ``analyze`` analyses every row (the speed of the views does not depend on the weights).
3. For each ``--n``, in a fresh subprocess: ``python -m reproduction.cli.bias analyze --data
   fakeddit --root <dir>/train.tsv --detectors-root <dir>/dets --n N --chunk C --json
   --no-progress --out <dir>/out_N`` (reading and checking the TSV's images, compiling, the
   five view runs (benefit, flow, causal; the improved benefit and causal), the ensembles,
   writing results.json and labels.csv). Reported per run: wall seconds of the command,
   ``samples_per_s`` = N / wall, each view's seconds inside ``analyze`` (its ``view_wall_s``,
   compilation included, and ``decode``: waiting for the decoded chunks), ``<view>_samples_per_s``
   = N / those seconds, and the child's peak resident memory (``os.wait4`` rusage
   ``ru_maxrss``, that process alone).
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

WORDS = ("council", "opens", "new", "library", "in", "town", "today", "aliens", "secretly",
         "replace", "moon", "with", "cheese", "shocking", "photo", "shows", "giant", "cat",
         "on", "roof", "mayor", "says", "bridge", "will", "close", "for", "repairs", "river",
         "floods", "street", "after", "storm", "old", "man", "builds", "boat", "from", "bottles")


def write_dataset(d: Path, n: int, seed: int = 0) -> Path:
    """``d/train.tsv`` + ``d/images/<id>.jpg`` for n rows (module docstring); returns the
    TSV. Rows already written (a TSV of n rows) are kept."""
    from PIL import Image

    from bias_jax.data import fakeddit as FD

    tsv = d / "train.tsv"
    if tsv.exists() and sum(1 for _ in open(tsv, encoding="utf-8")) == n + 1:
        return tsv
    rng = np.random.default_rng(seed)
    (d / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        real = i % 2 == 0
        uid = f"b{i:06d}"
        h, w = rng.integers(64, 81, 2)
        base = np.array([200, 40, 40] if real else [40, 40, 200]) * rng.uniform(0.5, 1.2)
        px = base + rng.integers(-40, 40, (h // 8 + 1, w // 8 + 1, 3)).repeat(8, 0).repeat(8, 1)[
            :h, :w]
        px = np.clip(px + rng.integers(-10, 10, (h, w, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(px).save(d / "images" / f"{uid}.jpg", "JPEG", quality=85)
        text = " ".join(rng.choice(WORDS, rng.integers(6, 14)))
        l2, l3, l6 = (1, 0, 0) if real else (0, 1 + i % 2, 1 + i % 5)
        rows.append({"author": "a", "clean_title": text, "created_utc": "1.0",
                     "domain": "i.imgur.com", "hasImage": "True", "id": uid, "image_url": "",
                     "linked_submission_id": "", "num_comments": "0", "score": "1",
                     "subreddit": "pics", "title": text, "upvote_ratio": "0.9",
                     "2_way_label": str(l2), "3_way_label": str(l3), "6_way_label": str(l6)})
    part = tsv.with_suffix(".tsv.part")
    with open(part, "w", newline="", encoding="utf-8") as f:
        wr = csv.writer(f, delimiter="\t", lineterminator="\n")
        wr.writerow(["", *FD.COLUMNS])  # pandas' unnamed index column
        for i, r in enumerate(rows):
            wr.writerow([i, *(r[c] for c in FD.COLUMNS)])
    os.replace(part, tsv)
    return tsv


def write_detectors(dets: Path, tsv: Path) -> None:
    """Random default-size detectors exported with the vocabulary of ``tsv``'s texts
    (module docstring)."""
    import jax

    from bias_jax import detectors as D
    from bias_jax import train as BT
    from bias_jax.data.text import Vocab

    records, _ = BT.read_real("fakeddit", tsv, check_images=False)
    vocab = Vocab.build(r.text for r in records)
    for i, kind in enumerate(D.KINDS):
        if (dets / D.SHIPPED[kind] / "config.json").exists():
            continue
        cfg = D.DetectorConfig(kind=kind, vocab_size=len(vocab))
        params = jax.jit(functools.partial(D.init_params, cfg))(jax.random.key(i))
        D.export_detector(dets / D.SHIPPED[kind], jax.device_get(params), cfg,
                          {"vocab": list(vocab.words)})


def run_analyze(tsv: Path, dets: Path, n: int, chunk: int, out: Path) -> dict:
    """One ``analyze`` in a fresh process (module docstring); its wall time, peak RSS and the
    per-view seconds of its results.json."""
    cmd = [sys.executable, "-m", "reproduction.cli.bias", "analyze", "--data", "fakeddit",
           "--root", str(tsv), "--detectors-root", str(dets), "--n", str(n), "--chunk",
           str(chunk), "--json", "--no-progress", "--out", str(out)]
    log = out.with_name(out.name + ".log")
    t = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        # wait4: the rusage of this child alone (RUSAGE_CHILDREN would be the max over all)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"analyze --n {n} failed (exit {proc.returncode}):\n"
                           f"{log.read_text()[-3000:]}")
    res = json.loads((out / "results.json").read_text())
    views = res["view_wall_s"]
    return {"n": res["n"], "chunk": chunk, "wall_s": round(wall, 1),
            "samples_per_s": round(res["n"] / wall, 1),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "view_s": {k: round(v, 1) for k, v in views.items()},
            **{f"{k}_samples_per_s": round(res["n"] / v, 1) for k, v in views.items() if v > 0},
            "command": " ".join(cmd)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True, type=Path, help="the generated Fakeddit folder")
    p.add_argument("--images", type=int, default=50000, help="rows / JPEGs to generate")
    p.add_argument("--n", type=int, nargs="+", default=[5000, 50000],
                   help="analysed samples per run (each at most --images)")
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = p.parse_args(argv)
    if max(args.n) > args.images:
        p.error(f"--n {max(args.n)} exceeds --images {args.images}")
    t = time.perf_counter()
    tsv = write_dataset(args.dir, args.images)
    gen_s = time.perf_counter() - t
    print(f"dataset: {tsv} ({args.images} rows; {gen_s:.0f} s)", file=sys.stderr)
    write_detectors(args.dir / "dets", tsv)
    report = {"images": args.images, "generate_s": round(gen_s, 1), "nproc": os.cpu_count(),
              "load_before": os.getloadavg(), "runs": []}
    for n in args.n:
        r = run_analyze(tsv, args.dir / "dets", n, args.chunk, args.dir / f"out_{n}")
        report["runs"].append(r)
        print(json.dumps(r), file=sys.stderr)
    report["load_after"] = os.getloadavg()
    if len(report["runs"]) > 1:
        report["rss_growth_mb"] = round(report["runs"][-1]["peak_rss_mb"]
                                        - report["runs"][0]["peak_rss_mb"], 1)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
