"""mmx_base.trees: host-side pytree helpers."""

import json
import math

import numpy as np

from mmx_base.trees import jsonable, n_params


def test_jsonable_gives_plain_json_values():
    x = {1: (np.float32(0.5), np.nan, math.inf), "b": np.array([[1, 2]], np.int64),
         "c": np.bool_(True), "d": [None, "s", np.int32(7)], "e": object}
    y = jsonable(x)
    assert y == {"1": [0.5, None, None], "b": [[1, 2]], "c": True, "d": [None, "s", 7],
                 "e": str(object)}
    assert type(y["c"]) is bool and type(y["d"][2]) is int
    json.dumps(y, allow_nan=False)  # strict JSON: no NaN, no numpy types left


def test_n_params_counts_every_scalar():
    assert n_params({"w": np.zeros((3, 4)), "b": [np.zeros(5), np.zeros(())]}) == 18
