"""The LARA dual, bisection and bootstrap against closed forms and independent solvers."""

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import brentq

from lara.calibrate.bestofn import expected_cost
from lara.calibrate.calibrate import CalibrationSettings, calibrate
from lara.calibrate.dual import (
    InputError,
    PromptScores,
    bootstrap,
    chunk_for,
    dual,
    dual_grad,
    mean_cost,
    resample_indices,
    solve,
    tilted_moments,
)


def heterogeneous(seed: int, n: int = 120, kmin: int = 3, kmax: int = 30) -> PromptScores:
    """Prompts with different sample counts, means, spreads and reward-cost correlations."""
    rng = np.random.default_rng(seed)
    k = rng.integers(kmin, kmax + 1, n)
    pid = np.repeat(np.arange(n), k)
    z1, z2 = rng.standard_normal(len(pid)), rng.standard_normal(len(pid))
    rho = np.repeat(rng.uniform(-0.3, 0.9, n), k)
    r = np.repeat(rng.normal(0, 1, n), k) + np.repeat(rng.uniform(0.5, 2, n), k) * z1
    c = np.repeat(rng.normal(0.3, 1, n), k) + np.repeat(rng.uniform(0.5, 2, n), k) * (
        rho * z1 + np.sqrt(1 - rho**2) * z2)
    perm = rng.permutation(len(pid))  # rows in any order
    return PromptScores.from_long(pid[perm], r[perm], c[perm])


def brute_grad(s: PromptScores, lam: float, tau: float, beta: float) -> float:
    """g'(lam) prompt by prompt with plain Python loops (an independent implementation)."""
    total = 0.0
    for i in range(s.n_prompts):
        r, c = s.reward[i, s.mask[i]], s.cost[i, s.mask[i]]
        a = (r - lam * c) / beta
        w = np.exp(a - a.max())
        total += float((w * c).sum() / w.sum())
    return tau - total / s.n_prompts


def naive_root(s: PromptScores, tau, beta, lam_max):
    f = lambda lam: dual_grad(s, [lam], tau, beta)[0]  # noqa: E731
    if f(0.0) >= 0:
        return 0.0
    if f(lam_max) < 0:
        return lam_max
    return brentq(f, 0.0, lam_max, xtol=1e-13, rtol=1e-15)


def test_bivariate_normal_closed_form():
    # (r, c) ~ N(mu, Sigma) for every prompt: E_{pi*_lam}[c] = mu_c + (rho s_r s_c - lam s_c^2)/beta,
    # so lam* = (beta (mu_c - tau) + rho s_r s_c) / s_c^2.
    mu_r, mu_c, s_r, s_c, rho, beta, tau = 0.3, 0.5, 1.0, 0.8, 0.6, 2.0, 0.0
    exact = (beta * (mu_c - tau) + rho * s_r * s_c) / s_c**2  # 2.3125
    errors = []
    for n, k in ((20, 20), (200, 200), (400, 2000)):
        rng = np.random.default_rng(7)
        z1, z2 = rng.standard_normal((n, k)), rng.standard_normal((n, k))
        r = mu_r + s_r * z1
        c = mu_c + s_c * (rho * z1 + np.sqrt(1 - rho**2) * z2)
        s = PromptScores.from_long(np.repeat(np.arange(n), k), r.ravel(), c.ravel())
        sol = solve(s, tau, beta, lam_max=10.0)
        assert sol.status == "interior"
        errors.append(abs(sol.lam - exact))
    assert errors[-1] < 0.02, errors  # N x K = 400 x 2000
    assert errors[0] > errors[1] > errors[2]  # the finite-sample error shrinks with N and K


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_solve_matches_an_independent_root_finder(seed):
    s = heterogeneous(seed)
    tau, beta = 0.0, [0.5, 1.0, 3.0][seed]
    sol = solve(s, tau, beta, lam_max=8.0, tol=1e-8)
    ref = brentq(lambda lam: brute_grad(s, lam, tau, beta), 0.0, 8.0, xtol=1e-12)
    assert sol.status == "interior" and abs(sol.lam - ref) <= 1e-8
    assert brute_grad(s, sol.lam, tau, beta) == pytest.approx(dual_grad(s, [sol.lam], tau, beta)[0], abs=1e-12)


@pytest.mark.parametrize("mode", ["soft", "bon"])
def test_the_bootstrap_does_not_depend_on_its_chunk_size(mode):
    s = heterogeneous(4, n=90, kmin=4)
    runs = [bootstrap(s, 0.1, 0.8, 6.0, 150, seed=2, mode=mode, chunk=chunk, bon_n=4 if mode == "bon" else None)
            for chunk in (None, 7, 1000)]
    for other in runs[1:]:  # the same replicates; sums in other blocks round in the last bit
        np.testing.assert_allclose(runs[0].lams, other.lams, rtol=0, atol=1e-12)
        np.testing.assert_array_equal(runs[0].status, other.status)
    # chunks sized from the number of prompts: the paper's N keeps the full 1000, ten times more a memory bound
    assert chunk_for(2000) == 1000 and chunk_for(20_000) < 200 and chunk_for(10**7) == 16
    assert 6 * 8 * chunk_for(20_000) * 20_000 <= 160 * 2**20


def test_bootstrap_matches_exact_roots_per_replicate():
    s = heterogeneous(3, n=150)
    tau, beta, lam_max, nb = 0.1, 0.8, 6.0, 200
    fast = bootstrap(s, tau, beta, lam_max, nb, seed=11)
    ref = []
    for idx in resample_indices(11, s.n_prompts, nb):
        sub = PromptScores(s.reward[idx], s.cost[idx], s.mask[idx], s.prompt_ids[idx])
        ref.append(naive_root(sub, tau, beta, lam_max))
    assert np.max(np.abs(fast.lams - np.array(ref))) < 1e-9


def test_dual_derivatives_and_monotonicity():
    s = heterogeneous(4)
    tau, beta = 0.2, 0.7
    grid = np.linspace(0, 5, 201)
    gp = dual_grad(s, grid, tau, beta)
    assert np.all(np.diff(gp) >= -1e-12)  # g' nondecreasing
    g = dual(s, grid, tau, beta)
    assert np.all(np.diff(g, 2) >= -1e-10)  # g convex
    h = 1e-5
    for lam in (0.0, 0.7, 2.5):
        fd = (dual(s, [lam + h], tau, beta)[0] - dual(s, [lam - h], tau, beta)[0]) / (2 * h)
        assert fd == pytest.approx(dual_grad(s, [lam], tau, beta)[0], abs=1e-7)
        _, _, var = tilted_moments(s, [lam], beta)
        fd2 = (dual_grad(s, [lam + h], tau, beta)[0] - dual_grad(s, [lam - h], tau, beta)[0]) / (2 * h)
        assert fd2 == pytest.approx(var.mean() / beta, rel=1e-5)  # g'' = mean Var / beta


def test_padding_does_not_change_the_dual():
    s = heterogeneous(5, n=40)
    for i in range(3):
        r, c = s.reward[i, s.mask[i]], s.cost[i, s.mask[i]]
        lam, beta = 0.9, 0.6
        a = (r - lam * c) / beta
        lme = np.log(np.mean(np.exp(a)))
        assert tilted_moments(s, [lam], beta)[0][i, 0] == pytest.approx(lme, rel=1e-12)


def test_boundaries():
    s = heterogeneous(6)
    hi = mean_cost(s, [0.0], 1.0)[0]
    lo = mean_cost(s, [4.0], 1.0)[0]
    inactive = solve(s, tau=hi + 0.01, beta=1.0, lam_max=4.0)
    assert inactive.status == "inactive" and inactive.lam == 0.0
    infeasible = solve(s, tau=lo - 0.01, beta=1.0, lam_max=4.0)
    assert infeasible.status == "infeasible" and not infeasible.feasible
    assert infeasible.cost_range == pytest.approx((lo, hi))
    boot = bootstrap(s, lo - 0.01, 1.0, 4.0, 50, seed=0)
    assert np.all(boot.lams[boot.status == 2] == 4.0)


def test_numerical_stability_with_extreme_scores():
    rng = np.random.default_rng(8)
    n, k = 50, 20
    r = rng.uniform(-1e3, 1e3, n * k)
    c = rng.uniform(-1e3, 1e3, n * k)
    s = PromptScores.from_long(np.repeat(np.arange(n), k), r, c)
    for beta in (1e-3, 1.0, 100.0):
        grid = np.linspace(0, 50.0, 11)
        for arr in tilted_moments(s, grid, beta):
            assert np.all(np.isfinite(arr))
        assert np.all(np.isfinite(dual(s, grid, 0.0, beta)))
        gp = dual_grad(s, grid, 0.0, beta)
        assert np.all(np.isfinite(gp)) and np.all(np.diff(gp) >= -1e-9 * 1e3)
        sol = solve(s, 0.0, beta, 50.0)
        assert np.isfinite(sol.lam) and 0 <= sol.lam <= 50
        boot = bootstrap(s, 0.0, beta, 50.0, 20, seed=1)
        assert np.all(np.isfinite(boot.lams))


def test_non_finite_scores_are_rejected_naming_the_row(tmp_path):
    with pytest.raises(InputError, match=r"column 'cost' holds a non-finite value \(nan\) at row 2"):
        PromptScores.from_long([0, 0, 1], [1.0, 2.0, 3.0], [0.0, 1.0, np.nan])
    with pytest.raises(InputError, match=r"column 'reward' holds a non-finite value \(inf\) at row 0"):
        PromptScores.from_long([0, 1], [np.inf, 1.0], [0.0, 1.0])
    path = tmp_path / "scores.csv"
    frame = pd.DataFrame({"prompt_id": ["a", "a", "b"], "reward": [1.0, np.nan, 0.5], "cost": [0, 1, 2]})
    frame.to_csv(path, index=False)
    proc = subprocess.run([sys.executable, "-m", "lara", "calibrate", "--scores", str(path), "--tau", "0",
                           "--out", str(tmp_path / "lambda.json")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "scores.csv: column 'reward' holds a non-finite value (nan) at row 1" in proc.stderr
    assert not (tmp_path / "lambda.json").exists()
    pd.DataFrame({"prompt_id": ["a"], "reward": [1.0]}).to_csv(path, index=False)
    proc = subprocess.run([sys.executable, "-m", "lara", "calibrate", "--scores", str(path), "--tau", "0",
                           "--out", str(tmp_path / "lambda.json")], capture_output=True, text=True)
    assert proc.returncode == 2 and "missing column(s) cost" in proc.stderr


def brute_bon_mean_cost(s: PromptScores, lam: float) -> float:
    chosen = []
    for i in range(s.n_prompts):
        r, c = s.reward[i, s.mask[i]], s.cost[i, s.mask[i]]
        best = max(range(len(r)), key=lambda k: (r[k] - lam * c[k], -c[k]))  # ties: lower cost
        chosen.append(c[best])
    return float(np.mean(chosen))


def test_bon_mode_matches_brute_force_selection():
    s = heterogeneous(9, n=60, kmin=2, kmax=12)
    grid = np.linspace(0, 4, 41)
    np.testing.assert_allclose(mean_cost(s, grid, 1.0, "bon"), [brute_bon_mean_cost(s, g) for g in grid])
    tau = float(np.median(mean_cost(s, grid, 1.0, "bon"))) - 1e-9  # between two levels of the step function
    sol = solve(s, tau, 1.0, 4.0, tol=1e-10, mode="bon")
    # the exact root is a breakpoint where some prompt's selection changes
    crossings = []
    for i in range(s.n_prompts):
        r, c = s.reward[i, s.mask[i]], s.cost[i, s.mask[i]]
        for a in range(len(r)):
            for b in range(len(r)):
                if c[a] > c[b]:
                    lam = (r[a] - r[b]) / (c[a] - c[b])
                    if 0 <= lam <= 4:
                        crossings.append(lam)
    candidates = sorted(crossings)
    exact = next(lam for lam in candidates if brute_bon_mean_cost(s, lam) <= tau)
    assert sol.lam == pytest.approx(exact, abs=1e-9)
    assert brute_bon_mean_cost(s, sol.lam) <= tau < brute_bon_mean_cost(s, sol.lam - 1e-6)
    boot = bootstrap(s, tau, 1.0, 4.0, 100, seed=3, mode="bon")
    for lam_b, idx in zip(boot.lams[:20], resample_indices(3, s.n_prompts, 100), strict=False):
        sub = PromptScores(s.reward[idx], s.cost[idx], s.mask[idx], s.prompt_ids[idx])
        assert lam_b == pytest.approx(solve(sub, tau, 1.0, 4.0, tol=1e-11, mode="bon").lam, abs=1e-9)


def test_bon_selection_helper_breaks_ties_towards_lower_cost():
    s = PromptScores.from_long([0, 0], [1.0, 1.0], [2.0, -1.0])
    assert expected_cost(s.reward, s.cost, s.mask, [0.0], None)[0, 0] == -1.0


def test_calibrate_is_deterministic_for_a_seed_and_cli_writes_the_record(tmp_path):
    s = heterogeneous(10)
    settings = CalibrationSettings(tau=0.0, beta=1.0, lambda_search_max=5.0, bootstrap=500, seed=4, mode="soft")
    a, b = calibrate(s, settings), calibrate(s, settings)
    a.pop("timing_s"), b.pop("timing_s")
    assert a == b
    c = calibrate(s, CalibrationSettings(tau=0.0, beta=1.0, lambda_search_max=5.0, bootstrap=500, seed=5, mode="soft"))
    assert c["lambda_hat"] == a["lambda_hat"] and c["lambda_star"] != a["lambda_star"]
    assert a["bootstrap"]["quantiles"]["0.975"] == a["lambda_star"] >= a["bootstrap"]["quantiles"]["0.5"]

    idx = np.argsort(s.prompt_ids)
    rows = [(pid, r, c) for i in idx for pid, r, c in zip([s.prompt_ids[i]] * s.counts[i],
                                                          s.reward[i, s.mask[i]], s.cost[i, s.mask[i]], strict=False)]
    path = tmp_path / "scores.parquet"
    pd.DataFrame(rows, columns=["prompt_id", "reward", "cost"]).to_parquet(path)
    outs = []
    for name in ("one.json", "two.json"):
        subprocess.run([sys.executable, "-m", "lara", "calibrate", "--scores", str(path), "--tau", "0",
                        "--mode", "soft",
                        "--beta", "1", "--lambda-search-max", "5", "--bootstrap", "500", "--quantile", "0.975",
                        "--seed", "4", "--out", str(tmp_path / name)], check=True, capture_output=True)
        outs.append(json.loads((tmp_path / name).read_text()))
    for o in outs:
        o.pop("timing_s")
        o["identity"].pop("seal")  # the seal covers the record's timings too
    assert outs[0] == outs[1]
    rec = outs[0]
    # ids are read as text (lara.read.files): the bootstrap draws prompts in the order of their text ids, so the
    # command's lambda* is the in-process calibration of the file as read
    from lara.calibrate.calibrate import load_scores

    assert rec["lambda_hat"] == pytest.approx(a["lambda_hat"], abs=1e-12)
    assert rec["lambda_star"] == calibrate(load_scores(path), settings)["lambda_star"]
    for key in ("lambda_hat", "lambda_star", "bootstrap", "feasible", "cost_range", "tau", "beta",
                "n_prompts", "samples_per_prompt", "seed", "curves"):
        assert key in rec
    assert rec["samples_per_prompt"]["min"] == 3 and rec["n_prompts"] == 120
    grid = rec["curves"]["lambda"]  # a linear and a logarithmic grid of 101 points each, merged
    assert len(grid) == len(rec["curves"]["g"]) == len(rec["curves"]["g_prime"]) > 101
    assert grid[0] == 0.0 and grid[1] == pytest.approx(rec["lambda_search_max"] * 1e-4) and grid == sorted(grid)


def test_cli_infeasible_fails_unless_allowed(tmp_path):
    path = tmp_path / "scores.csv"
    frame = pd.DataFrame({"prompt_id": [0, 0, 1, 1], "reward": [1.0, 0.0, 2.0, 0.0], "cost": [1.0, 0.5, 2.0, 1.0]})
    frame.to_csv(path, index=False)
    base = [sys.executable, "-m", "lara", "calibrate", "--scores", str(path), "--tau", "-1", "--bootstrap", "200",
            "--mode", "soft"]
    proc = subprocess.run(base + ["--out", str(tmp_path / "a.json")], capture_output=True, text=True)
    s = PromptScores.from_long([0, 0, 1, 1], [1.0, 0.0, 2.0, 0.0], [1.0, 0.5, 2.0, 1.0])
    lo, hi = mean_cost(s, [5.0, 0.0], 1.0)
    assert proc.returncode == 2 and "tau=-1.0 is not reachable" in proc.stderr
    assert f"ranges over [{lo:.6g}, {hi:.6g}]" in proc.stderr
    assert not (tmp_path / "a.json").exists()
    subprocess.run(base + ["--allow-infeasible", "--out", str(tmp_path / "b.json")], check=True, capture_output=True)
    rec = json.loads((tmp_path / "b.json").read_text())
    assert rec["feasible"] is False and rec["lambda_hat"] == 5.0 and rec["bootstrap"]["n_infeasible"] == 200


def _hand_scores(n_prompts: int, k: int = 4, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = [(f"p{i}", j, f"answer {i}.{j}", r, r + rng.normal()) for i in range(n_prompts) for j in range(k)
            for r in [rng.normal()]]
    return pd.DataFrame(rows, columns=["prompt_id", "sample_id", "response", "reward", "cost"])


@pytest.mark.parametrize("case, change, flags, says", [
    ("one prompt", lambda df: df[df.prompt_id == "p0"], [], "1 distinct prompt(s); a calibration needs at least 2"),
    ("ragged K, no N", lambda df: df[~((df.prompt_id == "p3") & (df.sample_id == 3))], [],
     "prompts have 3 to 4 samples; Best-of-N's N is then not one number"),
    ("costs in other units", lambda df: df.assign(cost=df.cost * 1e-13), [], "every cost is at most"),
    ("a tolerance that resolves nothing", lambda df: df, ["--mode", "soft", "--tolerance", "100"],
     "calibration.tolerance: 100 is more than a thousandth of lambda_search_max"),
    ("a search beyond 1e12", lambda df: df, ["--lambda-search-max", "1e13"], "lambda_search_max: 1e+13 is beyond 1e12"),
])
def test_a_calibration_states_only_what_its_data_can_tell(tmp_path, case, change, flags, says):
    """Refused, naming the file or key, no record written: a bootstrap over one prompt, a Best-of-N without one N,
    costs below the resolution the calibration compares them with, a bisection tolerance coarser than lambda."""
    change(_hand_scores(30)).to_parquet(tmp_path / "s.parquet")
    out = tmp_path / "lambda.json"
    proc = subprocess.run([sys.executable, "-m", "lara", "calibrate", "--scores", str(tmp_path / "s.parquet"),
                           "--tau", "0", "--bootstrap", "200", *flags, "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and says in proc.stderr and not out.exists(), proc.stderr[-800:]
    assert "Traceback" not in proc.stderr


def test_ragged_k_is_calibrated_with_an_explicit_n(tmp_path):
    df = _hand_scores(30)
    df[~((df.prompt_id == "p3") & (df.sample_id == 3))].to_parquet(tmp_path / "s.parquet")
    proc = subprocess.run([sys.executable, "-m", "lara", "calibrate", "--scores", str(tmp_path / "s.parquet"),
                           "--tau", "0", "--bootstrap", "200", "--bon-n", "3", "--allow-infeasible",
                           "--out", str(tmp_path / "lambda.json")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-800:]
    assert json.loads((tmp_path / "lambda.json").read_text())["decoder"]["n"] == 3
