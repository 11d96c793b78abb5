"""The README's "Explaining a model" blocks run as written, in order, in a fresh interpreter,
and print what the README says they print."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def use_blocks() -> list[str]:
    text = README.read_text()
    use = text[text.index("### Explaining a model"):]
    use = use[:use.index("\n## ")]
    return re.findall(r"^```python\n(.*?)^```", use, flags=re.S | re.M)


@pytest.mark.slow
def test_readme_use_blocks_run_and_print_their_results(tmp_path):
    blocks = use_blocks()
    assert len(blocks) == 4  # MultiSHAP, score your explainer, EMAP / InterSHAP, jackknife
    p = subprocess.run([sys.executable, "-c", "\n".join(blocks)], capture_output=True,
                       text=True, cwd=tmp_path, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout
    assert "visual (4, 5, 5) textual (4, " in out
    hit = float(re.search(r"top cell in the ground truth: ([\d.]+)", out).group(1))
    assert 0.0 <= hit <= 1.0
    rma = {m: float(v) for m, v in re.findall(r"^(\w+)\s+RMA ([\d.]+)", out, flags=re.M)}
    assert set(rma) == {"objects", "random", "oracle"}
    assert rma["oracle"] == 1.0 and rma["random"] < rma["objects"] < 1.0
    assert "caught: explainer objects does not accept budget keyword(s) wieght" in out

    def values(label):
        line = re.search(rf"^{label}\s+\[([^\]]*)\]", out, flags=re.M).group(1)
        return np.array(line.split(), float)

    emap, inter = values("EMAP synergy"), values("InterSHAP")
    assert emap.shape == inter.shape == (4,)
    assert np.all((emap >= 0) & (emap <= 1)) and np.all((inter >= 0) & (inter <= 1))
    # the README: the toy adds its modalities, so its synergy is small
    assert emap.max() < 0.2 and inter.max() < 0.2, (emap, inter)
    m = re.search(r"^InterSHAP \(authors'\) ([\d.]+) \[\s*([\d.]+)\s+([\d.]+)\]", out, flags=re.M)
    assert m, out
    mean, lo, hi = map(float, m.groups())
    assert 0.0 <= lo <= mean <= hi <= 1.0  # a set-level interval around its own mean
