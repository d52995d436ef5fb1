"""One small valid chain of every command the mutation suite (tests/unit/test_mutations.py) mutates the inputs of,
built through the real commands in this process (``lara.cli.main``) on the toy oracle scorer: no model is trained.

Only what needs a model is written by hand, the way the unit tests write it: the sampled responses (toy world
responses, stamped ``samples`` by :func:`lara.identity.stamp`) and the shift check's prompt features (random, stamped
``prompt_features``). :func:`build` returns a :class:`Chain`: per command the baseline invocations (argv and outputs,
each exits 0), and the named files of the chain the mutations draw "a file of another kind / role / tau / scenario"
from.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lara.settings import settings_class
from lara.steps import CORE_DECODERS

K, N, K_DEP = 4, 4, 4  # candidates per calibration/test prompt, Best-of-N size, candidates per deployment prompt
N_CAL, N_TEST, N_SEL = 30, 25, 20
STREAM_LENGTH, WINDOW = 200, 50
BOOT = 200
BOUNDS = "[-1.0, 5.0]"
COSTS = ("--cost", "violence=oracle", "--cost", "crime=oracle")
EVALS = ("--evaluation", "violence=oracle", "--evaluation", "crime=oracle")
SCENARIOS = {"heavy": {"harmful_share": 0.9, "held_out_share": 0.2}, "control": {}}

# the input flags every baseline gives (what the suite is parametrised over before the chain exists; the chain's
# baselines are checked against it): command -> flags, one tuple per baseline invocation of the command
BASELINES: dict[str, tuple[tuple[str, ...], ...]] = {
    "score": (("--input",),),
    "calibrate": (("--scores",), ("--scores", "--weights")),
    "select-bon": (("--candidates", "--lambda-json"),),
    "bon-sweep": (("--candidates", "--lambda-json", "--tau-lambda-json", "--k-lambda-json"),),
    **{name: (("--scores",),) for name in CORE_DECODERS},  # each of the core's own decoders, from its registration
    "evaluate": (("--responses",),),
    "judge": (("--responses",),),
    "aggregate": (("--scores", "--judge", "--bon-star", "--lambda-json", "--sweep"),),
    "score-constraints": (("--input",),),
    "calibrate-vector": (("--scores",),),
    "decode-vector": (("--lambda-json", "--candidates"),),
    "audit-constraints": (("--responses", "--lambda-json"),),
    "coverage": (("--scores",),),
    "deployment-pool": (("--calibration",),),
    "make-stream": (("--pool", "--scores"),),
    "online": (("--candidates", "--lambda-json"),),
    "shift-check": (("--features", "--calibration", "--deployment"),),
    "deploy-arms": (("--candidates", "--lambda-json", "--online", "--shift", "--weighted"),),
    "deployment-report": (("--arms", "--shift"),),
    "category-pairs": (("--input",),),
    "value-prompts": (("--sft", "--preferences"),),
    "oracle-score": (("--input",),),
    "split-prompts": (("--calibration-preferences",),),
    "coverage-vector": (("--scores",),),
    "calibrate-prune": (("--scores",),),
    "select-bon-prune": (("--candidates", "--lambda-json"),),
    "bon-prune-sweep": (("--candidates", "--lambda-json"),),
    "choose-decoder": (("--selection", "--calibration", "--test"),),
    "coverage-prune": (("--scores",),),
}

# a file of the chain that differs from a baseline input of kind KIND in the field FIELD (and as little else as the
# chain allows): (kind, field) -> the names of such files in Chain.files, the first of an allowed role is taken
ALTERNATIVES: dict[tuple[str, str], tuple[str, ...]] = {
    ("lambda", "tau"): ("lambda_tau2",),
    ("lambda", "n"): ("lambda_n2",),
    ("lambda", "lambda_record"): ("lambda_seed1",),  # the same tau and N, another calibration (its digest)
    ("lambda_weighted", "scenario"): ("lambda_weighted_control",),
    ("lambda_weighted", "tau"): ("lambda_weighted_tau2",),
    ("lambda_weighted", "n"): ("lambda_weighted_n2",),
    ("lambda_weighted", "calibration_set"): ("lambda_weighted_other_set",),  # other samples of the same prompts
    ("lambda_vector", "tau"): ("vlambda_tau2",),
    ("lambda_vector", "lambda_record"): ("vlambda_seed1",),
    ("constraint_scores", "cost_scorers"): ("vscores_test3",),
    ("responses_vector", "tau"): ("vbon_star_tau2",),
    ("responses_vector", "lambda_record"): ("vbon_star_seed1",),
    ("evaluation", "tau"): ("eval_bon_star_tau2",),
    ("evaluation", "lambda_record"): ("eval_bon_star_seed1",),
    ("stream", "scenario"): ("stream_control",),
    ("stream", "n"): ("stream_n2",),
    ("online", "scenario"): ("online_control_0.05",),
    ("online", "tau"): ("online_heavy_tau2",),
    ("online", "lambda_record"): ("online_heavy_seed1",),
    ("online", "window"): ("online_heavy_window",),
    ("online", "batch_size"): ("online_heavy_batch",),
    ("shift_check", "scenario"): ("shift_control",),
}


@dataclass
class Baseline:
    """One invocation that exits 0: its argv (text) and its outputs (flag -> path)."""

    command: str
    argv: list[str]
    outputs: dict[str, str]

    def inputs(self, flag: str) -> list[str]:
        """The values given to ``flag`` (several for a flag that takes several files)."""
        at = self.argv.index(flag) + 1
        values = []
        while at < len(self.argv) and not self.argv[at].startswith("--"):
            values.append(self.argv[at])
            at += 1
        return values

    def flags(self) -> tuple[str, ...]:
        """The table and JSON inputs it gives (in the contract table's order)."""
        from lara.read.contracts import CONTRACTS
        from lara.read.expect import JSON, TABLE

        row = CONTRACTS[self.command].inputs
        return tuple(f for f, e in row.items() if f in self.argv and e.fmt in (TABLE, JSON))

    def variant(self, flag: str, old, new, out_dir: Path) -> tuple[list[str], list[Path]]:
        """This invocation with ``new`` in place of the file ``old`` given to ``flag`` and every output moved into
        ``out_dir``: the argv and the outputs."""
        argv = list(self.argv)
        at = argv.index(flag) + 1 + self.inputs(flag).index(str(old))
        argv[at] = str(new)
        outs = []
        for oflag, old in self.outputs.items():
            new = out_dir / Path(old).name
            argv[argv.index(oflag) + 1] = str(new)
            outs.append(new)
        return argv, outs


@dataclass
class Chain:
    root: Path  # the folder results/x lies in
    results: Path  # root/results/x: every file of the chain (and every mutated file) lies under it
    baselines: dict[str, list[Baseline]] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)
    settings: dict = field(default_factory=dict)

    def baseline(self, command: str, flag: str) -> Baseline:
        """The first baseline of ``command`` that gives ``flag``."""
        for b in self.baselines.get(command, []):
            if flag in b.argv:
                return b
        raise KeyError(f"no baseline of {command} gives {flag}")


def lara(*argv) -> tuple[int, str]:
    """``lara`` in this process: the exit status and stderr."""
    from tests.conftest import lara_in_process

    rc, _, err = lara_in_process([str(a) for a in argv])
    return rc, err


def ok(*argv) -> None:
    rc, err = lara(*argv)
    if rc != 0:
        raise AssertionError(f"chain step lara {' '.join(map(str, argv))[:300]} exited {rc}:\n{err[-3000:]}")


def write_samples(prompts: Path, out: Path, k: int, seed: int) -> None:
    """Hand samples of the toy world's responses for ``prompts`` (as lara sample writes them, stamped)."""
    from lara import identity
    from lara.read.files import read_table, write_table
    from lara.toy.world import STYLES, TEMPLATES, Request, all_requests, find_topic, make_response

    df = read_table(prompts, required=("prompt_id", "prompt"))
    by_text = {r.text: r for r in all_requests()}
    rng = np.random.default_rng(seed)
    rows = []
    for pid, text in zip(df["prompt_id"], df["prompt"], strict=True):
        req = by_text.get(text)
        if req is None:
            topic = find_topic(text)
            req = Request(topic, topic.tasks[0], TEMPLATES[0], "")
        styles = [s for s in STYLES if s != "redirect" or req.topic.alternatives]
        for j in range(k):
            rows.append((pid, j, text, make_response(rng, req, str(rng.choice(styles))), 20))
    frame = pd.DataFrame(rows, columns=["prompt_id", "sample_id", "prompt", "response", "n_tokens"])
    made = identity.stamp("samples", out, role=identity.role_of(prompts), per_prompt=k,
                          prompts=identity.prompt_set(frame, str(out)).record(), made_from={"--prompts": prompts})
    write_table(frame, out, {"model": "hand-written toy samples (tests/unit/mutations_chain.py)", "n": k,
                             "seed": seed, identity.KEY: made})


def write_features(out: Path, shift: float, *prompt_files: Path) -> None:
    """Hand prompt features (random; the deployment prompts shifted), stamped as lara prompt-features stamps."""
    from lara import identity
    from lara.read.files import read_table, write_table

    frames = []
    for i, path in enumerate(prompt_files):
        ids = read_table(path, required=("prompt_id",))["prompt_id"].drop_duplicates().tolist()
        x = np.random.default_rng(100 + i).normal(size=(len(ids), 6))
        if "deployment" in Path(path).name:
            x[:, :2] += shift
        f = pd.DataFrame(x.astype(np.float32), columns=[f"f{j}" for j in range(6)])
        f.insert(0, "prompt_id", ids)
        frames.append(f)
    table = pd.concat(frames, ignore_index=True).drop_duplicates("prompt_id")
    made = identity.stamp("prompt_features", out, model="hand-written features", dim=6,
                          prompts=identity.prompt_set(table, str(out)).record())
    write_table(table, out, {"model": "hand-written features", identity.KEY: made})


def write_prefixes(scores: Path, out: Path, checkpoints=(2,)) -> None:
    """Hand prefix scores of a scored table (what lara score-prefixes adds with a tokenizer and partial models, which
    the chain has not): each checkpoint's prefix reward and cost the full ones plus seeded noise, stamped as it
    stamps them."""
    from lara import identity
    from lara.read.files import read_table, write_table

    df = read_table(scores)
    rng = np.random.default_rng(7)
    for t in checkpoints:
        df[f"prefix_reward_{t}"] = df["reward"] + rng.normal(size=len(df))
        df[f"prefix_cost_{t}"] = df["cost"] + rng.normal(size=len(df))
    made = identity.stamp("prefix_scores", out, **identity.inherit(identity.read_identity(scores), "role",
                                                                   "per_prompt", "prompts", "reward_scorer",
                                                                   "cost_scorer"),
                          checkpoints=list(checkpoints), prefix_reward_scorer="hand: reward + noise",
                          prefix_cost_scorer="hand: cost + noise", made_from={"--input": scores})
    write_table(df, out, {"input": str(scores), "checkpoints": list(checkpoints), identity.KEY: made})


def bon_expected(df: pd.DataFrame, lam: float, n: int, costs=("cost",)) -> np.ndarray:
    """Mean over prompts of the expected Best-of-n cost(s) at ``lam`` (ties to the lower combined cost)."""
    lam = np.atleast_1d(np.asarray(lam, float))
    out = []
    for _, g in df.groupby("prompt_id", sort=False):
        r = g["reward"].to_numpy(float)
        c = g[list(costs)].to_numpy(float)
        comb = c @ (lam if len(lam) == c.shape[1] else np.full(c.shape[1], lam[0]))
        order = np.lexsort((np.arange(len(r)), comb, -(r - comb)))
        k = len(r)
        p = np.array([math.comb(k - 1 - i, n - 1) for i in range(k)], float) / math.comb(k, n)
        out.append(p @ c[order])
    return np.mean(out, axis=0)


def build(root: Path) -> Chain:
    """The chain in ``root`` (results/x under it)."""
    R = root / "results" / "x"
    chain = Chain(root, R)
    f = chain.files
    for d in ("data", "calibration", "bon", "selection", "decode", "eval", "constraints", "deployment/heavy",
              "deployment/control", "toy"):
        (R / d).mkdir(parents=True, exist_ok=True)

    def base(command: str, *argv, outputs: tuple[str, ...] = ("--out",)) -> Baseline:
        argv = [command, *map(str, argv)]
        ok(*argv)
        b = Baseline(command, argv, {o: argv[argv.index(o) + 1] for o in outputs})
        chain.baselines.setdefault(command, []).append(b)
        return b

    toy = R / "toy"
    ok("make-toy-world", "--n-sft", 10, "--n-pairs", 40, "--n-eval-prompts", 100, "--n-deployment-prompts", 80,
       "--held-out-topic", "weapon", "--alpaca", toy / "alpaca.jsonl", "--preferences", toy / "pairs.jsonl",
       "--prompts", toy / "prompts.jsonl", "--deployment", toy / "deployment.jsonl")
    f["prompts_cal"], f["prompts_test"] = R / "data/prompts_calibration.parquet", R / "data/prompts_test.parquet"
    f["prompts_sel"] = R / "data/prompts_selection.parquet"
    ok("split-prompts", "--source", toy / "prompts.jsonl", "--n-calibration", N_CAL, "--n-test", N_TEST,
       "--n-selection", N_SEL, "--calibration", f["prompts_cal"], "--test", f["prompts_test"], "--selection",
       f["prompts_sel"])
    f["samples_cal"], f["samples_test"] = R / "calibration/samples.parquet", R / "bon/samples.parquet"
    write_samples(f["prompts_cal"], f["samples_cal"], K, 1)
    write_samples(f["prompts_test"], f["samples_test"], K, 2)
    f["scores_cal"], f["scores_test"] = R / "calibration/scores.parquet", R / "bon/scores.parquet"
    base("score", "--input", f["samples_cal"], "--reward", "oracle", "--cost", "oracle", "--out", f["scores_cal"])
    ok("score", "--input", f["samples_test"], "--reward", "oracle", "--cost", "oracle", "--out", f["scores_test"])

    # tau between the expected Best-of-N cost at lambda = 0 and under a heavy penalty
    cal = pd.read_parquet(f["scores_cal"])
    zero, heavy = float(bon_expected(cal, 0.0, N)[0]), float(bon_expected(cal, 50.0, N)[0])

    def calibrate(out, tau, *extra, n=N):
        return ("--scores", f["scores_cal"], "--tau", tau, "--bon-n", n, "--bootstrap", BOOT,
                "--lambda-search-max", 20, "--seed", 0, *extra, "--out", out)

    f["lambda"], f["lambda_tau2"], f["lambda_n2"] = (R / "calibration/lambda.json", R / "calibration/lambda_tau2.json",
                                                     R / "calibration/lambda_n2.json")
    taus = []
    for frac in (0.5, 0.6, 0.7, 0.4, 0.8, 0.3, 0.9):
        t = round(heavy + frac * (zero - heavy), 3)
        rc, _ = lara("calibrate", *calibrate(R / "calibration/probe.json", t))
        if rc == 0 and json.loads((R / "calibration/probe.json").read_text())["lambda_star"] > 0:
            taus.append(t)
        if len(taus) == 2:
            break
    assert len(taus) == 2, f"no two taus between {heavy:.3f} and {zero:.3f} calibrate to a positive lambda*"
    (R / "calibration/probe.json").unlink()
    tau, tau2 = taus
    chain.settings.update(tau=tau, tau2=tau2)
    base("calibrate", *calibrate(f["lambda"], tau))
    ok("calibrate", *calibrate(f["lambda_tau2"], tau2))
    ok("calibrate", *calibrate(f["lambda_n2"], tau, n=2))
    f["lambda_seed1"] = R / "calibration/lambda_seed1.json"
    argv = list(calibrate(f["lambda_seed1"], tau))
    argv[argv.index("--seed") + 1] = 1
    ok("calibrate", *argv)

    # Best-of-N on the test prompts, the sweep, evaluation, judge, aggregate
    for setting in ("zero", "star", "hat"):
        f[f"bon_{setting}"] = R / f"decode/bon_{setting}.parquet"
        argv = ("--candidates", f["scores_test"], "--setting", setting, "--overpenalised-lambda", 50,
                "--lambda-json", f["lambda"], "--out", f[f"bon_{setting}"])
        base("select-bon", *argv) if setting == "star" else ok("select-bon", *argv)
    for other in ("tau2", "seed1"):
        f[f"bon_star_{other}"] = R / f"decode/bon_star_{other}.parquet"
        ok("select-bon", "--candidates", f["scores_test"], "--setting", "star", "--overpenalised-lambda", 50,
           "--lambda-json", f[f"lambda_{other}"], "--out", f[f"bon_star_{other}"])
    # each of the core's own decoders at size 2 (its own record; Best-of-2 is audited in the sweep beside Best-of-4):
    # its settings are its class's fields, taken from one pool of values
    pool = {"k": 2, "n": N, "max_new_tokens": 48, "tau": tau, "lambda_search_max": 20, "bootstrap": BOOT,
            "quantile": 0.975, "guarantee": "bootstrap", "delta": 0.1, "cost_bounds": json.loads(BOUNDS),
            "grid_points": 101, "seed": 0}
    for name in CORE_DECODERS:
        fields = settings_class(name).__dataclass_fields__
        f["lambda_k2" if name == "calibrate-best-of-k" else name] = out = R / f"calibration/{name}.json"
        base(name, "--scores", f["scores_cal"], "--settings", json.dumps({k: pool[k] for k in fields}),
             "--allow-infeasible", "--out", out)
    f["sweep"] = R / "bon/sweep.csv"
    base("bon-sweep", "--candidates", f["scores_test"], "--lambda-json", f["lambda"], "--tau-lambda-json",
         f["lambda_tau2"], "--k-lambda-json", f["lambda_k2"], "--n", 2, N, "--lambda-grid", "[0, 1, 4]", "--tau", tau,
         "--bootstrap", BOOT, "--out", f["sweep"])
    for name in ("bon_zero", "bon_star", "bon_hat", "bon_star_tau2", "bon_star_seed1"):
        f[f"eval_{name}"] = R / f"eval/{name}_scores.parquet"
        f[f"judge_{name}"] = R / f"eval/{name}_judge.parquet"
        argv = ("--responses", f[name], "--out", f[f"eval_{name}"])
        base("evaluate", *argv) if name == "bon_star" else ok("evaluate", *argv)
        if name in ("bon_zero", "bon_star", "bon_hat"):
            argv = ("--responses", f[name], "--model", "oracle", "--out", f[f"judge_{name}"])
            base("judge", *argv) if name == "bon_star" else ok("judge", *argv)
    f["summary"], f["audit"] = R / "eval/summary.csv", R / "eval/constraint_audit.json"
    base("aggregate", "--scores", f["eval_bon_zero"], f["eval_bon_star"], f["eval_bon_hat"], "--judge",
         f["judge_bon_zero"], f["judge_bon_star"], f["judge_bon_hat"], "--bon-star", f["eval_bon_star"],
         "--lambda-json", f["lambda"], "--sweep", f["sweep"], "--tau", tau, "--bootstrap", BOOT,
         "--out", f["summary"], "--audit", f["audit"], outputs=("--out", "--audit"))
    f["coverage"], f["coverage_table"] = R / "calibration/coverage.json", R / "calibration/coverage.csv"
    coverage = {"tau": tau, "quantile": 0.9, "delta": 0.1, "cost_bounds": json.loads(BOUNDS), "lambda_search_max": 20,
                "bon_n": 2, "repeats": 3, "n_prompts": [10], "bootstrap": BOOT, "seed": 0}
    base("coverage", "--scores", f["scores_cal"], "--settings", json.dumps(coverage), "--out", f["coverage"],
         "--table", f["coverage_table"], outputs=("--out", "--table"))

    # pruned Best-of-N: its own record, its choice, its sweep and its coverage study on hand-written prefix scores
    f["prefix_cal"], f["prefix_test"] = R / "calibration/prefix_scores.parquet", R / "bon/prefix_scores.parquet"
    write_prefixes(f["scores_cal"], f["prefix_cal"])
    write_prefixes(f["scores_test"], f["prefix_test"])
    schedule = {"checkpoints": [2], "keep": [2], "n": N, "max_new_tokens": 48}
    prune = schedule | {"tau": tau, "lambda_search_max": 20, "bootstrap": BOOT, "quantile": 0.975,
                        "guarantee": "bootstrap", "delta": 0.1, "cost_bounds": json.loads(BOUNDS), "seed": 0,
                        "grid_points": 101, "max_subsets": 50}
    f["lambda_prune"] = R / "calibration/lambda_bon_prune.json"
    base("calibrate-prune", "--scores", f["prefix_cal"], "--settings", json.dumps(prune), "--allow-infeasible",
         "--out", f["lambda_prune"])
    base("select-bon-prune", "--candidates", f["prefix_test"], "--setting", "star", "--overpenalised-lambda", 50,
         "--lambda-json", f["lambda_prune"], "--settings", json.dumps(schedule), "--out",
         R / "decode/bon_prune.parquet")
    base("bon-prune-sweep", "--candidates", f["prefix_test"], "--lambda-json", f["lambda_prune"], "--settings",
         json.dumps(schedule | {"tau": tau, "lambda_grid": [0, 1, 4], "bootstrap": BOOT, "seed": 0}),
         "--out", R / "bon/prune_sweep.csv")
    # the token-budget chooser: Best-of-k and the one-schedule search space on a selection split of its own
    f["samples_sel"], f["scores_sel"] = R / "selection/samples.parquet", R / "selection/scores.parquet"
    f["prefix_sel"] = R / "selection/prefix_scores.parquet"
    write_samples(f["prompts_sel"], f["samples_sel"], K, 3)
    ok("score", "--input", f["samples_sel"], "--reward", "oracle", "--cost", "oracle", "--out", f["scores_sel"])
    write_prefixes(f["scores_sel"], f["prefix_sel"])
    budget = {k: v for k, v in prune.items() if k not in ("checkpoints", "keep")} | {
        "budgets": [0.6], "checkpoints": [2], "keep": [2], "ties": ["index"], "eval_bootstrap": BOOT}
    f["choice"], f["frontier"] = R / "decode/choice.json", R / "decode/frontier.csv"
    base("choose-decoder", "--selection", f["prefix_sel"], "--calibration", f["prefix_cal"], "--test",
         f["prefix_test"], "--settings", json.dumps(budget), "--out", f["choice"], "--table", f["frontier"],
         outputs=("--out", "--table"))
    base("coverage-prune", "--scores", f["prefix_cal"], f["prefix_test"], "--settings",
         json.dumps({k: v for k, v in prune.items() if k not in ("guarantee",)} | {"repeats": 3, "n_prompts": [10]}),
         "--out", R / "calibration/coverage_bon_prune.json", "--table", R / "calibration/coverage_bon_prune.csv",
         outputs=("--out", "--table"))

    # several constraints
    C = R / "constraints"
    f["vscores_cal"], f["vscores_test"], f["vscores_test3"] = (C / "calibration_scores.parquet",
                                                                C / "test_scores.parquet", C / "test_scores3.parquet")
    base("score-constraints", "--input", f["samples_cal"], "--reward", "oracle", *COSTS, "--out", f["vscores_cal"])
    ok("score-constraints", "--input", f["samples_test"], "--reward", "oracle", *COSTS, "--out", f["vscores_test"])
    ok("score-constraints", "--input", f["samples_test"], "--reward", "oracle", *COSTS, "--cost", "cost=oracle",
       "--out", f["vscores_test3"])
    vc = pd.read_parquet(f["vscores_cal"])
    cols = ("cost_violence", "cost_crime")
    z, h = bon_expected(vc, [0.0, 0.0], N, cols), bon_expected(vc, [30.0, 30.0], N, cols)

    def cons(frac):
        return json.dumps([{"name": nm, "cost": "oracle", "tau": round(float(h[j] + frac * (z[j] - h[j])), 3),
                            "evaluation": None, "bounds": None} for j, nm in enumerate(("violence", "crime"))],
                          sort_keys=True)

    vfrac = None
    f["vlambda"], f["vlambda_tau2"] = C / "lambda.json", C / "lambda_tau2.json"

    def vcal(out, frac, seed=0):
        return ("--scores", f["vscores_cal"], "--constraints", cons(frac), "--tau", json.loads(cons(frac))[0]["tau"],
                "--bon-n", N, "--bootstrap", BOOT, "--lambda-search-max", 20, "--cost-bounds", BOUNDS, "--seed", seed,
                "--out", out)

    fracs = []
    for frac in (0.6, 0.7, 0.5, 0.8, 0.4, 0.9):
        rc, _ = lara("calibrate-vector", *vcal(C / "probe.json", frac))
        if rc == 0:
            fracs.append(frac)
        if len(fracs) == 2:
            break
    assert len(fracs) == 2, "no two vector taus calibrate"
    (C / "probe.json").unlink()
    vfrac, vfrac2 = fracs
    chain.settings.update(constraints=cons(vfrac), vtau=json.loads(cons(vfrac))[0]["tau"])
    base("calibrate-vector", *vcal(f["vlambda"], vfrac))
    ok("calibrate-vector", *vcal(f["vlambda_tau2"], vfrac2))
    f["vlambda_seed1"] = C / "lambda_seed1.json"
    ok("calibrate-vector", *vcal(f["vlambda_seed1"], vfrac, seed=1))
    for setting in ("zero", "star"):
        f[f"vbon_{setting}"] = C / f"bon_{setting}.parquet"
        argv = ("--method", "bon", "--setting", setting, "--constraints", cons(vfrac), "--lambda-json", f["vlambda"],
                "--candidates", f["vscores_test"], "--out", f[f"vbon_{setting}"])
        base("decode-vector", *argv) if setting == "star" else ok("decode-vector", *argv)
    for other, frac in (("tau2", vfrac2), ("seed1", vfrac)):
        f[f"vbon_star_{other}"] = C / f"bon_star_{other}.parquet"
        ok("decode-vector", "--method", "bon", "--setting", "star", "--constraints", cons(frac), "--lambda-json",
           f[f"vlambda_{other}"], "--candidates", f["vscores_test"], "--out", f[f"vbon_star_{other}"])
    record = json.loads(f["vlambda"].read_text())
    cal = record["settings"]
    study = {k: cal[k] for k in ("tau", "quantile", "delta", "cost_bounds", "lambda_search_max", "bon_n")}
    f["vcoverage"], f["vcoverage_table"] = C / "coverage.json", C / "coverage.csv"
    base("coverage-vector", "--scores", f["vscores_cal"], f["vscores_test"], "--constraints", cons(vfrac),
         "--calibration-settings", json.dumps(cal), "--settings",
         json.dumps(study | {"repeats": 3, "n_prompts": [10], "bootstrap": BOOT}), "--out", f["vcoverage"],
         "--table", f["vcoverage_table"], outputs=("--out", "--table"))
    f["vaudit"], f["vaudit_table"] = C / "audit.json", C / "audit.csv"
    base("audit-constraints", "--responses", f["vbon_zero"], f["vbon_star"], "--constraints", cons(vfrac),
         "--lambda-json", f["vlambda"], "--reward", "oracle", *COSTS, *EVALS, "--tau", chain.settings["vtau"],
         "--bootstrap", BOOT, "--out", f["vaudit"], "--table", f["vaudit_table"], outputs=("--out", "--table"))

    # deployment: the pool, its scores, a stream per scenario, online runs, the shift check, the arms, the report
    D = R / "deployment"
    f["pool"] = R / "data/prompts_deployment.parquet"
    base("deployment-pool", "--source", toy / "deployment.jsonl", "--calibration", f["prompts_cal"], "--out", f["pool"])
    f["samples_dep"], f["scores_dep"] = D / "samples.parquet", D / "scores.parquet"
    write_samples(f["pool"], f["samples_dep"], K_DEP, 3)
    ok("score", "--input", f["samples_dep"], "--reward", "oracle", "--cost", "oracle", "--out", f["scores_dep"])
    dset = ("--tau", tau, "--bon-n", N, "--samples-per-prompt", K_DEP, "--stream-length", STREAM_LENGTH,
            "--window", WINDOW, "--seed", 0)
    chain.settings["deployment"] = dset
    for sc, schedule in SCENARIOS.items():
        f[f"stream_{sc}"] = D / sc / "stream.parquet"
        argv = ("--pool", f["pool"], "--scores", f["scores_dep"], "--scenario", sc, "--schedule", json.dumps(schedule),
                *dset, "--out", f[f"stream_{sc}"])
        base("make-stream", *argv) if sc == "heavy" else ok("make-stream", *argv)
        for eta in ("0.05", "0.5"):
            f[f"online_{sc}_{eta}"], f[f"online_{sc}_{eta}_json"] = (D / sc / f"online_{eta}.parquet",
                                                                     D / sc / f"online_{eta}.json")
            argv = ("--candidates", f[f"stream_{sc}"], "--lambda-json", f["lambda"], *dset, "--step-size", eta,
                    "--out", f[f"online_{sc}_{eta}"], "--record", f[f"online_{sc}_{eta}_json"])
            if sc == "heavy" and eta == "0.05":
                base("online", *argv, outputs=("--out", "--record"))
            else:
                ok("online", *argv)
    f["stream_n2"] = D / "heavy/stream_n2.parquet"
    argv = ["--pool", f["pool"], "--scores", f["scores_dep"], "--scenario", "heavy", "--schedule",
            json.dumps(SCENARIOS["heavy"]), *dset, "--out", f["stream_n2"]]
    argv[argv.index("--bon-n") + 1] = 2
    ok("make-stream", *argv)
    for other, changes in (("tau2", {"--tau": tau2, "--lambda-json": f["lambda_tau2"]}),
                           ("seed1", {"--lambda-json": f["lambda_seed1"]}), ("window", {"--window": 2 * WINDOW}),
                           ("batch", {"--batch-size": 2})):
        f[f"online_heavy_{other}"] = D / f"heavy/online_{other}.parquet"
        argv = ["--candidates", f["stream_heavy"], "--lambda-json", f["lambda"], *dset, "--step-size", "0.05",
                "--batch-size", 1, "--out", f[f"online_heavy_{other}"], "--record", D / f"heavy/online_{other}.json"]
        for flag, value in changes.items():
            argv[argv.index(flag) + 1] = value
        ok("online", *argv)
    f["features"] = D / "features.parquet"
    write_features(f["features"], 0.6, f["prompts_cal"], f["prompts_test"], f["pool"])
    shift = ("--n-prompts", 40, "--folds", 3, "--permutations", 19, "--min-ess", 5, "--seed", 1)
    for sc in SCENARIOS:
        f[f"shift_{sc}"], f[f"weights_{sc}"] = D / sc / "shift.json", D / sc / "weights.parquet"
        argv = ("--features", f["features"], "--calibration", f["prompts_cal"], "--deployment", f[f"stream_{sc}"],
                *shift, "--out", f[f"shift_{sc}"], "--weights", f[f"weights_{sc}"])
        base("shift-check", *argv, outputs=("--out", "--weights")) if sc == "heavy" else ok("shift-check", *argv)
        f[f"lambda_weighted_{sc}"] = D / sc / "lambda_weighted.json"
        argv = calibrate(f[f"lambda_weighted_{sc}"], tau, "--weights", f[f"weights_{sc}"])
        base("calibrate", *argv) if sc == "heavy" else ok("calibrate", *argv)
    f["lambda_weighted_tau2"] = D / "heavy/lambda_weighted_tau2.json"
    ok("calibrate", *calibrate(f["lambda_weighted_tau2"], tau2, "--weights", f["weights_heavy"]))
    f["lambda_weighted_n2"] = D / "heavy/lambda_weighted_n2.json"
    ok("calibrate", *calibrate(f["lambda_weighted_n2"], tau, "--weights", f["weights_heavy"], n=2))
    # the heavy weights on another calibration set: other samples of the calibration prompts, scored
    other = D / "heavy/other_set"
    write_samples(f["prompts_cal"], other / "samples.parquet", K, 7)
    ok("score", "--input", other / "samples.parquet", "--reward", "oracle", "--cost", "oracle", "--out",
       other / "scores.parquet")
    f["lambda_weighted_other_set"] = D / "heavy/lambda_weighted_other_set.json"
    argv = list(calibrate(f["lambda_weighted_other_set"], tau, "--weights", f["weights_heavy"]))
    argv[argv.index("--scores") + 1] = other / "scores.parquet"
    ok("calibrate", *argv)
    for sc in ("heavy", "control"):
        f[f"arms_{sc}"], f[f"trace_{sc}"] = D / sc / "arms.csv", D / sc / "trace.parquet"
        argv = ("--candidates", f[f"stream_{sc}"], "--lambda-json", f["lambda"], "--online", f[f"online_{sc}_0.05"],
                f[f"online_{sc}_0.5"], "--shift", f[f"shift_{sc}"], "--weighted", f[f"lambda_weighted_{sc}"], *dset,
                "--out", f[f"arms_{sc}"], "--trace", f[f"trace_{sc}"])
        base("deploy-arms", *argv, outputs=("--out", "--trace")) if sc == "heavy" else ok("deploy-arms", *argv)
    f["report"] = D / "report.csv"
    base("deployment-report", "--arms", f["arms_heavy"], f["arms_control"], "--shift", f["shift_heavy"],
         f["shift_control"], "--out", f["report"])

    # preference data: one category's pairs, the value models' prompts; the toy oracle's scores of a table
    f["preferences"], f["sft"] = toy / "preferences.parquet", toy / "sft.parquet"
    ok("prepare-data", "--kind", "preferences", "--source", toy / "pairs.jsonl", "--inconsistent", "drop",
       "--out", f["preferences"])
    ok("prepare-data", "--kind", "sft", "--source", toy / "alpaca.jsonl", "--out", f["sft"])
    f["prompts_cal_prefs"], f["prompts_test_prefs"] = toy / "calibration.parquet", toy / "test.parquet"
    base("split-prompts", "--source", toy / "prompts.jsonl", "--calibration-preferences", f["preferences"],
         "--n-calibration", 10, "--n-test", 10, "--calibration", f["prompts_cal_prefs"], "--test",
         f["prompts_test_prefs"], outputs=("--calibration", "--test"))
    f["pairs_violence"] = toy / "pairs_violence.parquet"
    base("category-pairs", "--input", f["preferences"], "--category", "violence", "--out", f["pairs_violence"])
    f["value_prompts"] = toy / "value_prompts.parquet"
    base("value-prompts", "--sft", f["sft"], "--preferences", f["preferences"], "--n-prompts", 10,
         "--out", f["value_prompts"])
    f["oracle_scores"] = toy / "oracle_scores.parquet"
    base("oracle-score", "--input", f["samples_test"], "--out", f["oracle_scores"])
    return chain


@pytest.fixture(scope="module")
def mutation_chain(tmp_path_factory) -> Chain:
    """The chain, built once per module (and per xdist worker)."""
    return build(tmp_path_factory.mktemp("mutations"))
