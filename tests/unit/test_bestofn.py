"""Exact Best-of-N calibration for N <= K against brute force: every N-subset enumerated, the
decoder's own selection inside each, and per-replicate roots found by scanning every crossing."""

import itertools
import json
import subprocess
import sys
from math import comb
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lara.calibrate.bestofn import expected_cost, order, rank_probabilities, roots, select, steps
from lara.calibrate.calibrate import CalibrationSettings, calibrate
from lara.calibrate.dual import PromptScores, bootstrap, resample_indices, solve
from lara.decode.bon import select as decoder_select


def gaussian(seed, p, k, rho=0.5):
    rng = np.random.default_rng(seed)
    r = rng.normal(size=(p, k))
    return r, rho * r + rng.normal(size=(p, k))


def brute_expected_cost(r, c, lam, n):
    """Mean over every n-subset of the cost the decoder picks inside it."""
    p, k = r.shape
    total = np.zeros(p)
    subsets = list(itertools.combinations(range(k), n))
    for sub in subsets:
        sub = np.asarray(sub)
        pick = decoder_select(r[:, sub], c[:, sub], [lam])[0]
        total += c[np.arange(p), sub[pick]]
    return total / len(subsets)


def test_rank_probabilities_are_the_hypergeometric_winner_law():
    for k, n in ((20, 1), (20, 4), (20, 20), (7, 3)):
        p = rank_probabilities(k, n)
        assert p.sum() == pytest.approx(1.0)
        expected = [comb(k - q - 1, n - 1) / comb(k, n) for q in range(k)]
        np.testing.assert_allclose(p, expected, rtol=1e-12, atol=1e-300)
    with pytest.raises(ValueError, match="N = 21, K = 20"):
        rank_probabilities(20, 21)


@pytest.mark.parametrize("n", [1, 4, 20])
def test_expected_cost_equals_enumerating_every_subset(n):
    k = 20
    r, c = gaussian(n, 3 if n == 4 else 6, k)  # 4845 subsets for N = 4: keep the prompts few
    mask = np.ones_like(r, dtype=bool)
    for lam in (0.0, 0.37, 1.5):
        np.testing.assert_allclose(expected_cost(r, c, mask, [lam], n)[:, 0], brute_expected_cost(r, c, lam, n),
                                   atol=1e-12)


def test_ties_are_broken_as_the_decoder_breaks_them():
    r = np.array([[1.0, 1.0, 1.0, 0.0]])
    c = np.array([[2.0, -1.0, -1.0, -5.0]])
    # r - 0 c ties three ways: the lower cost first, then the lower index
    assert order(r, c, 0.0)[0].tolist() == [1, 2, 0, 3]
    assert select(r, c, 0.0)[0] == decoder_select(r, c, [0.0])[0, 0] == 1
    # exactly at a crossing the lower-cost sample already wins (the value after the crossing)
    r2, c2 = np.array([[1.0, 0.0]]), np.array([[1.0, -1.0]])
    assert select(r2, c2, 0.5)[0] == 1 and select(r2, c2, 0.5 - 1e-9)[0] == 0


@pytest.mark.parametrize("n", [1, 3, 6])
@pytest.mark.parametrize("discrete", [False, True])
def test_calibrated_lambda_is_the_first_crossing_meeting_tau(n, discrete):
    rng = np.random.default_rng(7)
    p, k, lam_max = 25, 6, 4.0
    if discrete:  # many exact ties and several samples crossing at one lambda
        r = rng.integers(0, 4, size=(p, k)).astype(float)
        c = rng.integers(-2, 3, size=(p, k)).astype(float)
    else:
        r, c = gaussian(3, p, k)
    mask = np.ones_like(r, dtype=bool)
    st = steps(r, c, mask, n, lam_max)
    assert (st.delta < 0).all() and (np.diff(st.lam) >= 0).all()
    # every crossing of every pair, and the brute-force mean at each
    cands = {0.0, lam_max}
    for i in range(p):
        for a, b in itertools.combinations(range(k), 2):
            if c[i, a] != c[i, b]:
                lam = (r[i, a] - r[i, b]) / (c[i, a] - c[i, b])
                if 0 < lam <= lam_max:
                    cands.add(lam)
    cands = np.array(sorted(cands))
    means = np.array([brute_expected_cost(r, c, lam, n).mean() for lam in cands])
    assert (np.diff(means) <= 1e-12).all()  # nonincreasing in lambda
    # the step path reproduces the brute-force means at every crossing
    path = np.array([st.start.mean() + st.delta[st.lam <= lam].sum() / p for lam in cands])
    np.testing.assert_allclose(path, means, atol=1e-12)
    s = PromptScores(r, c, mask, np.arange(p))
    for tau in np.unique(means)[1:-1][:: max(1, len(np.unique(means)) // 5)]:
        sol = solve(s, tau, 1.0, lam_max, mode="bon", bon_n=n)
        exact = cands[np.argmax(means <= tau + 1e-12)]
        assert sol.status == "interior" and sol.lam == pytest.approx(exact, abs=1e-12)


def test_bootstrap_replicates_are_exact():
    r, c = gaussian(11, 30, 8)
    s = PromptScores(r, c, np.ones_like(r, dtype=bool), np.arange(30))
    n, tau, lam_max = 3, -0.6, 5.0
    boot = bootstrap(s, tau, 1.0, lam_max, 60, seed=5, mode="bon", bon_n=n)
    for lam_b, idx in zip(boot.lams, resample_indices(5, 30, 60), strict=True):
        sub = PromptScores(r[idx], c[idx], s.mask[idx], idx)
        assert lam_b == pytest.approx(solve(sub, tau, 1.0, lam_max, mode="bon", bon_n=n).lam, abs=1e-12)
    # weights given directly: the same roots
    w = np.stack([np.bincount(idx, minlength=30) / 30 for idx in resample_indices(5, 30, 60)])
    lams, status = roots(steps(r, c, s.mask, n, lam_max), w, tau, lam_max)
    np.testing.assert_allclose(lams, boot.lams, atol=1e-12)


def test_bon_mode_meets_tau_where_soft_mode_does_not():
    """The issue's case: on Gaussian (r, c) with N = K = 20, soft lambda* (beta = 1) misses tau for
    Best-of-N; the bon-mode lambda* meets it (on the calibration prompts) at the boundary."""
    r, c = gaussian(0, 2000, 20)
    s = PromptScores(r, c, np.ones_like(r, dtype=bool), np.arange(2000))
    for tau in (0.3, -0.5):
        bon = calibrate(s, CalibrationSettings(tau=tau, mode="bon", bon_n=20, bootstrap=200))
        soft = calibrate(s, CalibrationSettings(tau=tau, mode="soft", beta=1.0, bootstrap=200))
        assert bon["decoder"] == {"kind": "best_of_n", "n": 20, "k": 20}
        assert soft["decoder"] == {"kind": "gibbs_tilt", "beta": 1.0}
        at = expected_cost(r, c, s.mask, [bon["lambda_hat"], soft["lambda_hat"]], 20).mean(axis=0)
        assert at[0] <= tau and bon["decoder_cost_at_lambda_hat"] == pytest.approx(at[0])
        assert abs(at[1] - tau) > 0.05  # soft lambda-hat misses the Best-of-N boundary
        # bon lambda-hat is the boundary: any smaller lambda violates tau
        assert expected_cost(r, c, s.mask, [bon["lambda_hat"] * (1 - 1e-6)], 20).mean() > tau


def test_cli_bon_n_larger_than_k_names_both(tmp_path):
    r, c = gaussian(1, 5, 4)
    path = tmp_path / "scores.parquet"
    pd.DataFrame({"prompt_id": np.repeat(np.arange(5), 4).astype(str), "reward": r.ravel(),
                  "cost": c.ravel()}).to_parquet(path)
    out = tmp_path / "lambda.json"
    proc = subprocess.run([sys.executable, "-m", "lara", "calibrate", "--scores", str(path), "--tau", "0",
                           "--mode", "bon", "--bon-n", "5", "--bootstrap", "200", "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "N = 5" in proc.stderr and "K = 4" in proc.stderr and not out.exists()
    proc = subprocess.run([sys.executable, "-m", "lara", "calibrate", "--scores", str(path), "--tau", "0",
                           "--mode", "bon", "--bon-n", "2", "--bootstrap", "200", "--allow-infeasible",
                           "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lam = json.loads(out.read_text())
    assert lam["decoder"] == {"kind": "best_of_n", "n": 2, "k": 4} and lam["mode"] == "bon"


def test_config_rejects_a_best_of_n_larger_than_the_calibration_samples():
    from lara.config import ConfigError, load_yaml, validate

    base = load_yaml(Path(__file__).resolve().parents[2] / "config" / "config.yaml")
    assert validate(base)["calibration"]["mode"] == "bon"
    bad = base | {"decode": base["decode"] | {"bon_n": 21}}
    with pytest.raises(ConfigError, match=r"decode.bon_n: .*N = 21.*K = 20"):
        validate(bad)
    # in soft mode N is free (the soft dual does not depend on N), where no step calibrates Best-of-N itself (no
    # several constraints, no Best-of-N sweep, no deployment stage)
    soft = bad | {"calibration": base["calibration"] | {"mode": "soft", "constraints": [], "cost_bounds": None},
                  "decode": bad["decode"] | {"methods": ["args"]}, "deployment": {"scenarios": []}}
    assert validate(soft)["decode"]["bon_n"] == 21
    with pytest.raises(ConfigError, match=r"decode.bon_n: .*N = 21.*\(calibration.constraints\)"):
        validate(soft | {"calibration": soft["calibration"] | {"constraints": base["calibration"]["constraints"]}})


def test_sweep_rows_are_the_decoders_choice_with_intervals_and_verdicts():
    from lara.decode.bon import select
    from lara.decode.sweep import sweep_table
    from lara.stats import VERDICTS

    r, c = gaussian(4, 256, 20)
    lams = [0.0, 0.5, 2.0]
    full = sweep_table(r, c, lams, ["grid"] * 3, 20, tau=-0.3, n_boot=500)
    # N = M: exactly the argmax selection that `lara select-bon` makes
    chosen = c[np.arange(len(c))[None], select(r, c, lams)]
    np.testing.assert_allclose(full["mean_cost"], chosen.mean(1), atol=1e-12)
    np.testing.assert_allclose(full["safe_fraction"], (chosen <= 0).mean(1), atol=1e-12)
    for col in ("mean_reward", "mean_cost", "safe_fraction"):
        assert (full[f"{col}_lo"] <= full[col]).all() and (full[col] <= full[f"{col}_hi"]).all()
    # the verdicts follow the one-sided bounds, which lie inside the two-sided interval
    for row in full.to_dict("records"):
        assert row["mean_cost_lo"] <= row["mean_cost_lower"] <= row["mean_cost"] <= row["mean_cost_upper"] \
            <= row["mean_cost_hi"]
        expected = (VERDICTS[0] if row["mean_cost_upper"] <= -0.3 else
                    VERDICTS[2] if row["mean_cost_lower"] > -0.3 else VERDICTS[1])
        assert row["verdict"] == expected
    # a smaller N: the exact subset average, a weaker selection (less reward at lambda = 0)
    small = sweep_table(r, c, lams, ["grid"] * 3, 4, tau=None, n_boot=50)
    assert small["mean_reward"].iloc[0] < full["mean_reward"].iloc[0]
    np.testing.assert_allclose(small["mean_cost"], expected_cost(r, c, np.ones_like(r, dtype=bool), lams, 4).mean(0))
    assert "verdict" not in small.columns


def test_crossings_do_not_depend_on_the_block_sizes(monkeypatch):
    from lara.calibrate import bestofn

    rng = np.random.default_rng(7)
    reward, cost = rng.normal(size=(300, 12)), rng.normal(size=(300, 12))
    cost[5, 3] = cost[5, 4]  # equal costs never cross
    reward[9, :4], cost[9, :4] = 1.0, np.array([0.5, 0.5, 1.0, 1.5])  # ties: recomputed from the expectation
    mask = np.ones_like(reward, dtype=bool)
    mask[11, 10:] = False
    whole = bestofn.steps(reward, cost, mask, 4, 5.0)
    monkeypatch.setattr(bestofn, "PROMPT_BLOCK_BYTES", 1)  # one prompt per block
    monkeypatch.setattr(bestofn, "BLOCK_BYTES", 1)
    blocked = bestofn.steps(reward, cost, mask, 4, 5.0)
    for field in ("lam", "prompt", "delta", "start", "end"):
        np.testing.assert_array_equal(getattr(whole, field), getattr(blocked, field))


def test_the_fast_choice_is_the_first_of_the_full_order():
    rng = np.random.default_rng(3)
    reward = np.round(rng.normal(size=(400, 8)), 1)  # rounded: many exact ties in r - lam c
    cost = np.round(rng.normal(size=(400, 8)), 1)
    reward[:5] = 1.0  # whole rows tied: the lowest cost wins, then the lowest index
    mask = rng.random((400, 8)) > 0.1
    mask[:, 0] = True
    for lam in (0.0, 0.5, 1.0, 2.0):
        for m in (None, mask):
            np.testing.assert_array_equal(select(reward, cost, lam, m), order(reward, cost, lam, m)[:, 0])


def _grid_cases():
    """(reward, cost, lams): continuous scores; scores on a 0.1 lattice with a grid on it (crossings land
    exactly on grid points, three-way ties); integers (whole tied rows, equal-cost twins); huge rewards
    with tiny costs and repeated samples; near-twins inside the tie tolerance; unsorted grids with
    repeats and negative lambdas."""
    rng = np.random.default_rng(11)
    for case in range(40):
        p, k = int(rng.integers(1, 80)), int(rng.integers(1, 25))
        kind = case % 4
        if kind == 0:
            r, c = rng.normal(size=(p, k)), rng.normal(size=(p, k))
            lams = rng.normal(size=int(rng.integers(16, 60))) * 3
        elif kind in (1, 2):
            scale = 10 if kind == 1 else 1
            r = np.round(rng.normal(size=(p, k)) * scale) / scale
            c = np.round(rng.normal(size=(p, k)) * scale) / scale
            lams = rng.choice(np.round(np.arange(-1, 6, 0.1), 1), size=int(rng.integers(16, 60)))
        else:
            r, c = rng.normal(size=(p, k)) * 1e6, rng.normal(size=(p, k)) * 1e-3
            r[:, : k // 2], c[:, : k // 2] = r[:, :1], c[:, :1]
            lams = np.sort(rng.normal(size=int(rng.integers(16, 60)))) * 1e9
        if case % 8 == 3:  # near-twins: a later copy a hair (inside the tie tolerance) better than the first
            r[:, k // 2:], c[:, k // 2:] = r[:, : k - k // 2] * (1 + 1e-13) + 1e-13, c[:, : k - k // 2]
        yield r, c, lams
    # crossings that overflow: costs a subnormal apart, rewards equal or huge
    r = np.array([[1.0, 1.0, 0.0, 1e308], [0.0, 0.0, 0.0, -1e308]])
    c = np.array([[5e-324, 0.0, -1.0, 1e-300], [1e-300, 0.0, 5e-324, 1e300]])
    yield r, c, np.r_[np.linspace(-2.0, 3.0, 30), 0.0, 1e-300, -1e-300]


@pytest.mark.parametrize("grid_min", [16, 1])
def test_the_grid_sweep_is_select_at_every_lambda(monkeypatch, grid_min):
    """select_grid follows each prompt's winner from crossing to crossing; it must give what select
    gives lambda by lambda, ties included (grid_min = 1: the crossing walk even for the shortest grids)."""
    from lara.calibrate import bestofn

    monkeypatch.setattr(bestofn, "GRID_MIN", grid_min)
    walked = 0
    for r, c, lams in _grid_cases():
        per_lam = np.stack([select(r, c, lam) for lam in lams])
        np.testing.assert_array_equal(bestofn.select_grid(r, c, lams), per_lam)
        walked += len(lams) >= max(grid_min, r.shape[1] // 2)
    assert walked >= 20  # most cases took the crossing walk, not the per-lambda fallback


def test_the_order_is_score_then_cost_then_index():
    """On integer scores (exact ties, no rounding) the order is a plain sort by (-score, cost, index),
    masked samples last; rows with and without ties mixed in one call."""
    rng = np.random.default_rng(5)
    r = rng.integers(-3, 4, size=(300, 9)).astype(float)
    c = rng.integers(-2, 3, size=(300, 9)).astype(float)
    r[::3] = rng.permutation(np.arange(9.0))  # every third row: distinct scores at lambda = 0
    c[::3] = 0.0
    mask = rng.random(r.shape) > 0.15
    for lam in (0.0, 0.5, 1.0, 3.0):
        for m in (None, mask):
            s = np.where(m if m is not None else True, r - lam * c, -np.inf)
            brute = [sorted(range(9), key=lambda j, i=i: (-s[i, j], c[i, j] if np.isfinite(s[i, j]) else 0, j))
                     for i in range(len(r))]
            np.testing.assert_array_equal(order(r, c, lam, m), brute)


def test_best_of_all_expectations_are_the_values_at_the_argmax():
    from lara.calibrate.bestofn import expected

    r, c = gaussian(7, 50, 12)
    r[:5] = np.round(r[:5])  # some ties
    c[:5] = np.round(c[:5])
    lams = np.linspace(0.0, 3.0, 40)
    mask = np.ones_like(r, dtype=bool)
    got = expected(r, c, mask, lams, None, r, c)
    pick = np.stack([decoder_select(r, c, [lam])[0] for lam in lams], axis=1)  # (P, L)
    np.testing.assert_array_equal(got[0], np.take_along_axis(r, pick, axis=1))
    np.testing.assert_array_equal(got[1], np.take_along_axis(c, pick, axis=1))
    # the rank-average formula (what N < K uses) gives the same numbers for N = K
    probs = np.zeros(12)
    probs[0] = 1.0
    generic = np.stack([(probs * np.take_along_axis(c, order(r, c, lam), axis=1)).sum(axis=1) for lam in lams], 1)
    np.testing.assert_allclose(got[1], generic, rtol=0, atol=0)


def test_the_paper_s_soft_estimator_is_an_arm_of_the_sweep(tmp_path, capsys):
    """Soft mode at several beta on the same scores, its lambda* applied to Best-of-N: one row per beta at
    the largest N, labelled soft_beta=B, with the Best-of-N expected cost and the verdict at that lambda;
    a bon-mode record given as a soft one is refused, naming the file."""
    from lara.calibrate.record import write_lambda
    from lara.cli import main
    from lara.decode.sweep import sweep_table

    r, c = gaussian(7, 120, 8)
    ids = np.repeat([f"p{i}" for i in range(120)], 8)
    pd.DataFrame({"prompt_id": ids, "sample_id": np.tile(np.arange(8), 120), "reward": r.ravel(),
                  "cost": c.ravel()}).to_parquet(tmp_path / "cand.parquet")
    scores = PromptScores.from_long(ids, r.ravel(), c.ravel())
    soft = {}
    for beta in (0.1, 1.0):
        rec = calibrate(scores, CalibrationSettings(tau=-0.3, mode="soft", beta=beta, bootstrap=200))
        write_lambda(rec, tmp_path / f"soft{beta}.json")
        soft[beta] = rec["lambda_star"]
    write_lambda(calibrate(scores, CalibrationSettings(tau=-0.3, mode="bon", bon_n=8, bootstrap=200)),
                 tmp_path / "bon.json")
    argv = ["bon-sweep", "--candidates", str(tmp_path / "cand.parquet"), "--lambda-json", str(tmp_path / "bon.json"),
            "--soft-lambda-json", str(tmp_path / "soft0.1.json"), str(tmp_path / "soft1.0.json"), "--n", "4", "8",
            "--tau", "-0.3", "--bootstrap", "200", "--lambda-grid", "[0, 1]", "--out", str(tmp_path / "sweep.csv")]
    assert main(argv) in (0, None)
    table = pd.read_csv(tmp_path / "sweep.csv")
    rows = table[table["label"].str.startswith("soft_beta=")]
    assert sorted(rows["label"]) == ["soft_beta=0.1", "soft_beta=1"] and (rows["n"] == 8).all()
    for beta, label in ((0.1, "soft_beta=0.1"), (1.0, "soft_beta=1")):
        row = rows[rows["label"] == label].iloc[0]
        assert row["lambda"] == soft[beta]
        ref = sweep_table(r, c, [soft[beta]], [label], 8, tau=-0.3, n_boot=200)
        assert row["mean_cost"] == pytest.approx(ref["mean_cost"].iloc[0]) and row["verdict"] == ref["verdict"].iloc[0]
    # the Gibbs tilt is not argmax Best-of-N: a larger beta is a softer tilt and needs another lambda
    assert soft[0.1] != soft[1.0]
    capsys.readouterr()
    argv[argv.index(str(tmp_path / "soft0.1.json"))] = str(tmp_path / "bon.json")
    assert main(argv) == 2 and "bon.json: calibrated in bon mode; --soft-lambda-json takes soft-mode records" \
        in capsys.readouterr().err


@pytest.mark.parametrize("n", [None, 3, 8])
def test_each_row_at_its_own_lambda_is_expected_of_that_row_alone_to_the_bit(n):
    """expected_rows ranks every (row, lambda) in one batch; each row's value must be the one expected() gives
    that row alone at that lambda, bit for bit (the vector path, LTT and the coverage study rely on it): rows with
    masked samples, exact score ties and near ties (within the tie tolerance) mixed in."""
    from lara.calibrate.bestofn import expected, expected_rows

    rng = np.random.default_rng(11)
    rows, k = 300, 8
    reward = rng.normal(size=(rows, k))
    cost = rng.normal(size=(rows, k))
    reward[::7, 1], cost[::7, 1] = reward[::7, 0], cost[::7, 0]  # exact copies
    reward[1::9, 2] = reward[1::9, 3] + 1e-14  # inside the tie tolerance of a neighbour at lambda 0
    mask = np.ones((rows, k), dtype=bool)
    if n != 8:
        mask[::5, -2:] = False  # fewer samples: the rank average, not the pick
    lams = rng.choice([0.0, 0.5, 1.0, 2.5], size=rows)
    values = (cost, rng.normal(size=(rows, k)))
    batch = expected_rows(reward, cost, mask, lams, n, *values)
    for i in range(rows):
        alone = expected(reward[i:i + 1], cost[i:i + 1], mask[i:i + 1], [lams[i]], n, *(v[i:i + 1] for v in values))
        assert np.array_equal(batch[:, i], alone[:, 0, 0]), i
