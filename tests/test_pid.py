"""PID (BROJA) solver: textbook tables, identities, and an independent convex solver (cvxpy)."""

import importlib
import jax
import jax.numpy as jnp
import numpy as np
import pytest

PID = importlib.import_module("gridvqa_jax.explain.pid")  # the module; the package binds the function

KEYS = ("redundancy", "unique1", "unique2", "synergy")


def h2(p):
    """Binary entropy in bits."""
    return -(p * np.log2(p) + (1 - p) * np.log2(1 - p))


def gate(fn):
    """p[x1, x2, y] for uniform independent bits x1, x2 and y = fn(x1, x2)."""
    p = np.zeros((2, 2, 2))
    for a in range(2):
        for b in range(2):
            p[a, b, fn(a, b)] += 0.25
    return p


def run(p):
    return {k: float(v) for k, v in PID.pid(jnp.asarray(p, jnp.float32)).items()}


# --- independent numpy information measures (natural log inside, bits out) -------------------
def np_mi(pxy):
    pxy = np.asarray(pxy, np.float64)
    o = pxy.sum(1, keepdims=True) * pxy.sum(0, keepdims=True)
    m = pxy > 0
    return float(np.sum(pxy[m] * np.log2(pxy[m] / o[m])))


def np_cond_mi(q):
    """I_Q(X1; Y | X2) = sum_x2 Q(x2) I(X1; Y | X2 = x2) of q[x1, x2, y]."""
    total = 0.0
    for j in range(q.shape[1]):
        w = q[:, j, :].sum()
        if w > 0:
            total += w * np_mi(q[:, j, :] / w)
    return total


def random_tables(seed, n):
    """Random tables of varied small shapes; every other one with ~30% zero cells."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        shape = tuple(int(s) for s in rng.integers(2, 5, 3))
        p = rng.dirichlet(np.full(int(np.prod(shape)), 0.5)).reshape(shape)
        if k % 2:
            p[rng.random(shape) < 0.3] = 0
            p[0, 0, 0] += 1e-3  # never all-zero
            p /= p.sum()
        out.append(p)
    return out


# --- textbook tables -------------------------------------------------------------------------
def test_xor_is_one_bit_of_synergy():
    r = run(gate(lambda a, b: a ^ b))
    assert r["synergy"] == pytest.approx(1.0, abs=1e-5)
    for k in ("redundancy", "unique1", "unique2"):
        assert abs(r[k]) < 1e-5


def test_copy_is_one_bit_of_redundancy():
    p = np.zeros((2, 2, 2))
    p[0, 0, 0] = p[1, 1, 1] = 0.5  # Y = X1 = X2
    r = run(p)
    assert r["redundancy"] == pytest.approx(1.0, abs=1e-5)
    for k in ("unique1", "unique2", "synergy"):
        assert abs(r[k]) < 1e-5


@pytest.mark.parametrize("which", [1, 2])
def test_unique_information(which):
    """Y = X_which, the other variable independent noise: 1 bit of unique information."""
    r = run(gate((lambda a, b: a) if which == 1 else (lambda a, b: b)))
    assert r[f"unique{which}"] == pytest.approx(1.0, abs=1e-5)
    for k in set(KEYS) - {f"unique{which}"}:
        assert abs(r[k]) < 1e-5


def test_and_gate_bertschinger_values():
    """AND (Bertschinger et al. 2014, Table/Example): U1 = U2 = 0, R = I(X1; Y), S = 1/2 bit."""
    r = run(gate(lambda a, b: a & b))
    i_x1_y = h2(0.25) - 0.5 * h2(0.5)  # H(Y) - H(Y | X1) = 0.8113 - 0.5
    assert r["redundancy"] == pytest.approx(i_x1_y, abs=1e-5)
    assert r["redundancy"] == pytest.approx(0.311, abs=1e-3)
    assert r["synergy"] == pytest.approx(0.5, abs=1e-5)
    assert abs(r["unique1"]) < 1e-5 and abs(r["unique2"]) < 1e-5


def test_zeros_and_unused_symbols():
    """A copy table padded with an unused x1 value, x2 value and y value is still 1 bit R."""
    p = np.zeros((3, 4, 3))
    p[0, 1, 2] = p[2, 3, 0] = 0.5
    r = run(p)
    assert r["redundancy"] == pytest.approx(1.0, abs=1e-5)
    assert all(np.isfinite(list(r.values())))


def test_swapping_sources_swaps_uniques():
    p = random_tables(3, 1)[0]
    a, b = run(p), run(np.transpose(p, (1, 0, 2)))
    assert a["unique1"] == pytest.approx(b["unique2"], abs=2e-5)
    assert a["redundancy"] == pytest.approx(b["redundancy"], abs=2e-5)
    assert a["synergy"] == pytest.approx(b["synergy"], abs=2e-5)


# --- identities and signs on random tables, batched ------------------------------------------
def test_identities_nonnegativity_and_vmap():
    tables = [p for p in random_tables(0, 24) if p.shape == (3, 3, 2)]
    tables += [np.random.default_rng(5).dirichlet(np.ones(18)).reshape(3, 3, 2) for _ in range(4)]
    batch = jnp.asarray(np.stack(tables), jnp.float32)
    out = {k: np.asarray(v) for k, v in jax.vmap(PID.pid)(batch).items()}
    for n, p in enumerate(tables):
        i1, i2, i12 = np_mi(p.sum(1)), np_mi(p.sum(0)), np_mi(p.reshape(-1, p.shape[2]))
        r, u1, u2, s = (out[k][n] for k in KEYS)
        assert r + u1 == pytest.approx(i1, abs=2e-6)
        assert r + u2 == pytest.approx(i2, abs=2e-6)
        assert r + u1 + u2 + s == pytest.approx(i12, abs=2e-6)
        assert min(r, u1, u2, s) >= -1e-6
        single = run(p)
        for k in KEYS:  # batched == one at a time
            assert out[k][n] == pytest.approx(single[k], abs=1e-6)


def test_solver_reports_convergence():
    p = jnp.asarray(random_tables(1, 2)[1], jnp.float32)
    _, info = PID.solve_q(p)  # float32 default tol 1e-5 nats
    assert float(info["gap"]) <= 1e-5 and float(info["marginal_error"]) <= 1e-5
    assert int(info["iterations"]) < 20_000


def test_joint_from_labels_matches_histogram():
    rng = np.random.default_rng(0)
    x1, x2, y = rng.integers(0, 3, 200), rng.integers(0, 4, 200), rng.integers(0, 2, 200)
    ref, _ = np.histogramdd(np.stack([x1, x2, y], 1), bins=(3, 4, 2), range=((0, 3), (0, 4), (0, 2)))
    got = PID.joint_from_labels(jnp.asarray(x1), jnp.asarray(x2), jnp.asarray(y), 3, 4, 2)
    np.testing.assert_allclose(np.asarray(got), ref / 200, atol=1e-7)


# --- independent convex solver ----------------------------------------------------------------
def cvxpy_q(p):
    """argmax_Q H_Q(Y | X1, X2) over Delta_p by cvxpy's exponential-cone (rel_entr) formulation."""
    cp = pytest.importorskip("cvxpy", reason="cvxpy (test-only dependency) is not installed")
    n1, n2, ny = p.shape
    q = [cp.Variable((n1, n2), nonneg=True) for _ in range(ny)]
    q12 = sum(q)
    cons = []
    for y in range(ny):
        cons += [cp.sum(q[y], axis=1) == p[:, :, y].sum(1), cp.sum(q[y], axis=0) == p[:, :, y].sum(0)]
    # sum_y rel_entr(Q_y, Q_12) = -H_Q(Y | X1, X2)
    prob = cp.Problem(cp.Minimize(sum(cp.sum(cp.rel_entr(q[y], q12)) for y in range(ny))), cons)
    solver = "CLARABEL" if "CLARABEL" in cp.installed_solvers() else None
    prob.solve(solver=solver)
    assert prob.status == "optimal", prob.status
    return np.clip(np.stack([v.value for v in q], axis=2), 0, None)


def cvxpy_pid(p):
    """PID from the cvxpy optimum by the definitions (Bertschinger et al. 2014)."""
    q = cvxpy_q(p)
    q = q / q.sum()
    u1 = np_cond_mi(q)  # I_Q(X1; Y | X2)
    u2 = np_cond_mi(np.transpose(q, (1, 0, 2)))  # I_Q(X2; Y | X1)
    iq = np_mi(q.reshape(-1, q.shape[2]))
    return {
        "redundancy": np_mi(p.sum(1)) + np_mi(p.sum(0)) - iq,  # co-information under Q*
        "unique1": u1,
        "unique2": u2,
        "synergy": np_mi(p.reshape(-1, p.shape[2])) - iq,
    }


@pytest.mark.parametrize("shape", [(2, 3, 2), (3, 4, 3), (4, 4, 4)])
def test_matches_cvxpy_on_random_tables(shape):
    """8 random tables per shape (24 in all, half with ~30% zeros), solved as one vmapped batch."""
    pytest.importorskip("cvxpy", reason="cvxpy (test-only dependency) is not installed")
    rng = np.random.default_rng(sum(shape))
    tables = []
    for k in range(8):
        p = rng.dirichlet(np.full(int(np.prod(shape)), 0.5)).reshape(shape)
        if k % 2:
            p[rng.random(shape) < 0.3] = 0
            p[0, 0, 0] += 1e-3
            p /= p.sum()
        tables.append(p)
    ours = {k: np.asarray(v) for k, v in jax.vmap(PID.pid)(jnp.asarray(np.stack(tables), jnp.float32)).items()}
    worst = 0.0
    for n, p in enumerate(tables):
        ref = cvxpy_pid(p)
        worst = max(worst, max(abs(float(ours[k][n]) - ref[k]) for k in KEYS))
    # float32 solve, stopped at a duality gap of 1e-5 nats; cvxpy's interior point ~1e-8
    assert worst < 1e-5, worst


def test_matches_cvxpy_in_float64():
    pytest.importorskip("cvxpy", reason="cvxpy (test-only dependency) is not installed")
    p = random_tables(11, 2)[1]
    ref = cvxpy_pid(p)
    with jax.enable_x64(True):
        ours = {k: float(v) for k, v in PID.pid(jnp.asarray(p, jnp.float64), tol=1e-10, max_iters=100_000).items()}
    for k in KEYS:
        assert ours[k] == pytest.approx(ref[k], abs=1e-6)
