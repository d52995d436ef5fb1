"""The token-budget chooser (``lara choose-decoder``, docs/budget.md) on SmolLM2 real text.

    python benchmarks/budget_realtext.py [--model results/real-text/import/smollm2-135m-instruct] \\
        [--prompts-file results/real-text/data/rtp_prompts.jsonl] [--n-selection 40 --n-cal 60 --n-test 40] \\
        [--n 16] [--tau 0.27] [--budgets 0.1 0.25 0.5] [--out-dir results/real-text-budget] [--no-figure] [--threads 1]

Builds the chooser's three prompt sets for real: three disjoint seeded sets of RealToxicityPrompts prompts (selection,
calibration, test; ids and deduplication as ``lara split`` gives them, :func:`lara.data.splits.split_prompts`), K = N
responses per prompt sampled from SmolLM2-135M-Instruct (:class:`lara.sample.HFGenerator`, T = 1.2, top-k 50, a seed
per split), scored by reward ``fluency:<model>`` and cost ``hatesonar:offensive``, and the prefixes at the chooser's
checkpoints (:func:`lara.decode.prefixes.prefixes`) scored by the same two scorers. Each split is written as the
parquet ``lara score-prefixes`` writes (columns ``prefix_reward_<t>``, ``prefix_cost_<t>``; stamped ``prefix_scores``
with its role) under ``--out-dir``; a split whose parquet exists is reused, so rerunning the chooser (another tau, other
budgets) samples nothing.

Then runs ``lara choose-decoder`` on them (choice.json, frontier.csv in ``--out-dir``) and, where ``lara figure
--kind frontier`` is there, draws figures/frontier.{png,pdf}. Printed: the calibration split's cost scale (Best-of-N's
mean P(offensive) at lambda = 0, Best-of-1's, the per-prompt minimum: where a tau binds), and per budget the chosen
decoder, its certified lambda*, held-out reward with its 95 % interval, cost and verdict, tokens, and the paired test
gain over the best Best-of-k at equal or fewer tokens (and over the best within the budget, where the chooser names
another); and whether a pruned schedule won anywhere.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

ROLES = ("selection", "calibration", "test")


def log(msg: str) -> None:
    print(msg, flush=True)


def draw_splits(args) -> dict:
    """{role: DataFrame(prompt_id, prompt)}: three disjoint seeded sets, deduplicated and named as the workflow's
    split step names them (the calibration and test prompts first, the selection prompts after, one shuffle)."""
    from lara.data.splits import split_prompts
    from lara.read.files import read_table

    pool = read_table(args.prompts_file, required=("prompt",))["prompt"]
    cal, test, sel = split_prompts(pool, args.n_cal, args.n_test, args.seed, args.prompts_file, args.n_selection)
    return {"selection": sel, "calibration": cal, "test": test}


class Builder:
    """The generator and the scorers, loaded once and only when a split must be built."""

    def __init__(self, args):
        from lara.sample import GenerationSettings, HFGenerator
        from lara.scoring import load_scorer

        t0 = time.perf_counter()
        self.reward_spec, self.cost_spec = f"fluency:{args.model}", f"hatesonar:{args.constraint}"
        self.scorers = {"reward": load_scorer(self.reward_spec, role="reward", device=args.device),
                        "cost": load_scorer(self.cost_spec, role="cost")}
        self.gen = HFGenerator(args.model, device=args.device)
        self.settings = GenerationSettings(temperature=args.temperature, top_k=args.top_k,
                                           max_new_tokens=args.max_new_tokens, batch_size=max(args.n, 20))
        log(f"loaded SmolLM2 ({args.model}) and the scorers ({self.reward_spec}, {self.cost_spec}) on "
            f"{self.gen.device} in {time.perf_counter() - t0:.0f} s")

    def score(self, prompts, texts, label: str) -> dict:
        from lara.scoring import score_table

        out = {}
        for col, scorer in self.scorers.items():
            out[col] = np.asarray(score_table(scorer, prompts, texts, f"{label}: {col}"), float)
            if not np.isfinite(out[col]).all():
                raise RuntimeError(f"{label}: non-finite {col} scores")
        return out

    def build(self, role: str, frame, seed: int, args, t0: float):
        from lara.decode.prefixes import prefixes

        df = self.gen.generate(frame["prompt_id"].tolist(), frame["prompt"].tolist(), args.n, self.settings, seed)
        log(f"  {role}: {len(df)} samples ({len(frame)} prompts x {args.n}) in {time.perf_counter() - t0:.0f} s; "
            f"mean {df['n_tokens'].mean():.1f} tokens, {100 * (df['n_tokens'] < args.max_new_tokens).mean():.0f}% "
            "stopped at EOS")
        prompts, responses = df["prompt"].tolist(), df["response"].tolist()
        full = self.score(prompts, responses, f"{role} responses")
        df["reward"], df["cost"] = full["reward"], full["cost"]
        log(f"  {role}: {len(df)} responses scored in {time.perf_counter() - t0:.0f} s; reward mean "
            f"{df['reward'].mean():.4f}, cost mean {df['cost'].mean():.4f}")
        for t in args.checkpoints:
            texts = prefixes(self.gen.tokenizer, prompts, responses, t)
            got = self.score(prompts, texts, f"{role} prefixes at {t} tokens")
            df[f"prefix_reward_{t}"], df[f"prefix_cost_{t}"] = got["reward"], got["cost"]
            log(f"  {role}: prefixes at {t} tokens scored ({len(df)} samples, {100 * (df['n_tokens'] > t).mean():.0f}%"
                f" cut) in {time.perf_counter() - t0:.0f} s; prefix reward mean {got['reward'].mean():.4f}, cost "
                f"mean {got['cost'].mean():.4f}")
        return df


def write_split(df, path: Path, role: str, builder: Builder, args, seed: int) -> None:
    """The table stamped as ``lara score-prefixes`` stamps its output (the samples' and scores' fields inherited)."""
    from lara import identity
    from lara.provenance import code_version
    from lara.read.files import write_table

    checkpoints = sorted(args.checkpoints)
    made = identity.stamp("prefix_scores", path, role=role, per_prompt=args.n,
                          prompts=identity.prompt_set(df, str(path), per_prompt=args.n).record(),
                          reward_scorer=builder.reward_spec, cost_scorer=builder.cost_spec, checkpoints=checkpoints,
                          prefix_reward_scorer=builder.reward_spec, prefix_cost_scorer=builder.cost_spec,
                          made_from={"--prompts-file": args.prompts_file})
    write_table(df, str(path), {"model": args.model, "prompts_file": args.prompts_file, "role": role, "n": args.n,
                                "seed": seed, "settings": {"temperature": args.temperature, "top_k": args.top_k,
                                                           "max_new_tokens": args.max_new_tokens},
                                "checkpoints": checkpoints, "code": code_version(), identity.KEY: made})


def check_cached(path: Path, role: str, frame, args) -> None:
    """A reused table is the one this run would build: its role, K, prompts and checkpoints."""
    from lara import identity
    from lara.read.files import read_table

    found = identity.read_identity(path)
    df = read_table(str(path), required=("prompt_id", "sample_id"))
    want = identity.prompt_set(frame, f"the {role} prompts").record()
    problems = []
    if found.get("role") != role:
        problems.append(f"role {found.get('role')}")
    if found.get("per_prompt") != args.n:
        problems.append(f"{found.get('per_prompt')} samples per prompt")
    if identity.prompt_set(df, str(path)).record() != want:
        problems.append("other prompts")
    if not set(args.checkpoints) <= set(found.get("checkpoints") or []):
        problems.append(f"checkpoints {found.get('checkpoints')}")
    if problems:
        raise SystemExit(f"{path}: cached, but made with {', '.join(problems)} (expected the {role} split of this "
                         "run): delete it, or name another --out-dir")


def tables(args, out: Path) -> dict:
    splits = draw_splits(args)
    seeds = {role: args.seed + 1000 * i for i, role in enumerate(("calibration", "test", "selection"))}
    paths = {role: out / f"{role}_prefix_scores.parquet" for role in ROLES}
    todo = [r for r in ROLES if not paths[r].is_file()]
    for role in ROLES:
        if role not in todo:
            check_cached(paths[role], role, splits[role], args)
            log(f"{role}: reusing {paths[role]}")
    if todo:
        builder = Builder(args)
        t0 = time.perf_counter()
        for role in todo:
            log(f"{role}: sampling {len(splits[role])} prompts x {args.n} (seed {seeds[role]})")
            df = builder.build(role, splits[role], seeds[role], args, t0)
            write_split(df, paths[role], role, builder, args, seeds[role])
            log(f"  {role}: wrote {paths[role]} ({time.perf_counter() - t0:.0f} s)")
    return paths


def cost_scale(path: Path, n: int) -> dict:
    """Where a tau binds on a split: Best-of-N's mean cost at lambda = 0 (the most reward), Best-of-1's (any lambda),
    and the per-prompt minimum (Best-of-N as lambda grows: no decoder of these samples goes below it)."""
    from lara.read.files import read_table

    df = read_table(str(path))
    out = {"best_of_n_at_0": [], "best_of_1": [], "min": []}
    for _, g in df.groupby("prompt_id", sort=False):
        g = g.sort_values("sample_id")
        r, c = g["reward"].to_numpy(float)[:n], g["cost"].to_numpy(float)[:n]
        out["best_of_n_at_0"].append(c[np.argmax(r)])
        out["best_of_1"].append(c.mean())
        out["min"].append(c.min())
    return {k: float(np.mean(v)) for k, v in out.items()}


def choose(args, paths: dict, out: Path) -> dict:
    from lara.cli import main as lara

    settings = {"budgets": args.budgets, "checkpoints": sorted(args.checkpoints), "keep": args.keep,
                "max_checkpoints": args.max_checkpoints, "ties": args.ties, "n": args.n,
                "max_new_tokens": args.max_new_tokens, "grid_points": args.grid_points,
                "max_subsets": args.max_subsets, "eval_bootstrap": args.eval_bootstrap, "seed": args.seed,
                "tau": args.tau, "lambda_search_max": args.lambda_max, "bootstrap": args.bootstrap,
                "quantile": 0.975, "guarantee": "bootstrap", "delta": 0.1, "cost_bounds": [0.0, 1.0]}
    t0 = time.perf_counter()
    rc = lara(["choose-decoder", "--selection", str(paths["selection"]), "--calibration",
               str(paths["calibration"]), "--test", str(paths["test"]), "--settings", json.dumps(settings),
               "--out", str(out / "choice.json"), "--table", str(out / "frontier.csv")])
    if rc:
        raise SystemExit(f"lara choose-decoder failed (exit {rc})")
    log(f"choose-decoder: {time.perf_counter() - t0:.0f} s; {out / 'choice.json'}, {out / 'frontier.csv'}")
    return json.loads((out / "choice.json").read_text())


def figure(out: Path) -> Path | None:
    """figures/frontier.png where ``lara figure --kind frontier`` is there, else None."""
    from lara.cli import main as lara
    from lara.evaluate.figures import KINDS

    if "frontier" not in KINDS:
        log("lara figure has no --kind frontier here: no figure")
        return None
    fig = out / "figures"
    rc = lara(["figure", "--kind", "frontier", "--frontier", str(out / "frontier.csv"), "--choice",
               str(out / "choice.json"), "--rule", "budget_realtext", "--png", str(fig / "frontier.png"),
               "--pdf", str(fig / "frontier.pdf"), "--provenance", str(fig / "frontier.provenance.json")])
    if rc:
        log(f"lara figure --kind frontier failed (exit {rc}): no figure")
        return None
    return fig / "frontier.png"


def report(choice: dict, scale: dict, tau: float) -> None:
    log(f"\ncalibration split, mean P(offensive): Best-of-N at lambda 0 {scale['best_of_n_at_0']:.4f}, Best-of-1 "
        f"{scale['best_of_1']:.4f}, per-prompt minimum {scale['min']:.4f}; tau {tau:g}")
    log(f"full Best-of-N on the selection split: {choice['full_best_of_n_tokens']:.1f} tokens per prompt")
    head = (f"{'budget':>6} {'tokens':>7}  {'chosen':24} {'lambda*':>8}  {'held-out reward [95% CI]':>28}  "
            f"{'cost':>6}  {'verdict':12} {'tokens':>7}  {'vs best Best-of-k <= tokens: test gain [95% CI]':>48}")
    log(head)
    won = []
    for b in choice["budgets"]:
        if b["chosen"] is None:
            log(f"{b['budget']:6g} {b['tokens']:7.1f}  nothing meets tau within the budget")
            continue
        h, d = b["held_out"], b["deployed"]
        vs = b.get("versus_best_of_k")
        gain = ("-" if vs is None else
                f"{vs['best_of_k']} {vs['test_reward_gain']['mean']:+.4f} [{vs['test_reward_gain']['ci95'][0]:+.4f}, "
                f"{vs['test_reward_gain']['ci95'][1]:+.4f}]")
        log(f"{b['budget']:6g} {b['tokens']:7.1f}  {b['chosen']:24} {d['lambda_star']:8.4g}  {h['mean_reward']:9.4f} "
            f"[{h['mean_reward_ci95'][0]:.4f}, {h['mean_reward_ci95'][1]:.4f}]  {h['mean_cost']:6.4f}  "
            f"{h['verdict'].split(' (')[0]:12} {h['mean_tokens']:7.1f}  {gain:>48}")
        inb = b.get("versus_best_of_k_in_budget")
        if inb is not None and (vs is None or inb["best_of_k"] != vs["best_of_k"]):
            g = inb["test_reward_gain"]
            log(f"{'':>6} {'':>7}  vs the best Best-of-k within the budget: {inb['best_of_k']} {g['mean']:+.4f} "
                f"[{g['ci95'][0]:+.4f}, {g['ci95'][1]:+.4f}] (selection gain {inb['selection_reward_gain']:+.4f})")
        if b["chosen"].startswith("pruned:"):
            won.append((b, vs))
    if not won:
        log("no pruned schedule won at any budget: Best-of-k chosen (or nothing fits) everywhere")
    for b, vs in won:
        sel = "" if vs is None else f", selection gain {vs['selection_reward_gain']:+.4f}"
        log(f"pruned schedule won at budget {b['budget']:g}: {b['chosen']}{sel}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="results/real-text/import/smollm2-135m-instruct")
    p.add_argument("--prompts-file", default="results/real-text/data/rtp_prompts.jsonl")
    p.add_argument("--n-selection", type=int, default=40)
    p.add_argument("--n-cal", type=int, default=60)
    p.add_argument("--n-test", type=int, default=40)
    p.add_argument("--n", type=int, default=16, help="K = N samples per prompt")
    p.add_argument("--checkpoints", type=int, nargs="+", default=[2, 4, 8, 16])
    p.add_argument("--keep", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--max-checkpoints", type=int, default=2)
    p.add_argument("--ties", nargs="+", default=["index", "keep"])
    p.add_argument("--budgets", type=float, nargs="+", default=[0.1, 0.25, 0.5])
    p.add_argument("--constraint", default="offensive")
    p.add_argument("--tau", type=float, default=0.27)
    p.add_argument("--lambda-max", type=float, default=100.0)
    p.add_argument("--grid-points", type=int, default=501)
    p.add_argument("--max-subsets", type=int, default=500)
    p.add_argument("--bootstrap", type=int, default=10000)
    p.add_argument("--eval-bootstrap", type=int, default=2000)
    p.add_argument("--device", default=None, help="default: cuda where there is one, else cpu")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (1: on a shared machine more threads wait on each other, several times "
                        "slower)")
    p.add_argument("--temperature", type=float, default=1.2)
    p.add_argument("--top-k", type=int, default=50)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default="results/real-text-budget")
    p.add_argument("--no-figure", action="store_true")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    log(f"token-budget chooser on real text: SmolLM2 {args.model}; {args.n_selection} selection, {args.n_cal} "
        f"calibration, {args.n_test} test prompts ({args.prompts_file}); K = N = {args.n}, T {args.temperature}, "
        f"top-k {args.top_k}, {args.max_new_tokens} new tokens; checkpoints {args.checkpoints}, keep {args.keep}; "
        f"budgets {args.budgets}; tau {args.tau}")
    paths = tables(args, out)
    choice = choose(args, paths, out)
    report(choice, cost_scale(paths["calibration"], args.n), args.tau)
    png = None if args.no_figure else figure(out)
    log(f"\ndone in {time.perf_counter() - t0:.0f} s; {out / 'choice.json'}, {out / 'frontier.csv'}"
        + (f", {png}" if png else ""))


if __name__ == "__main__":
    main()
