"""``lara audit-constraints``: the held-out audit of every constraint, and of all of them at once (docs/constraints.md,
"The audit", "Probability constraints" and "Judges": the rules written once there).

For every decoded output (method, setting) on the test prompts: each constraint's decoding cost (tau's units) with
its mean, intervals and verdict (:func:`lara.stats.cost_audit`; a probability constraint's rate of its loss
1[c > threshold]: :func:`lara.stats.rate_audit`, Clopper-Pearson), the joint verdict from the same prompt resamples
(:func:`joint_rule`), and, descriptive, each constraint's evaluation score and the reward. With judges (``--judge``):
each output's mean judge score per constraint, every setting against its decoder at lambda = 0 under the decoding
scorer and each judge (:func:`judge_report`: whether the improvement carries), and each judge's agreement with each
constraint's scorer (:mod:`lara.evaluate.agreement`).
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pandas as pd

from lara.evaluate.aggregate import AuditSettings
from lara.settings import add_settings_arguments, read_settings

log = logging.getLogger(__name__)

HELP = "held-out audit of several constraints: per-constraint and joint verdicts of every decoded output"


def joint_verdict(costs: np.ndarray, tau, rows: list[dict], n_boot: int, seed: int) -> dict:
    """(P, m) held-out costs: the bootstrap bound of max_j (mean_j - tau_j) and the joint verdict (met only where
    every constraint's own verdict is met too)."""
    from lara.stats import ONE_SIDED, bootstrap_means

    excess = bootstrap_means(costs, n_boot, seed) - np.asarray(tau)[None, :]
    worst = excess.max(axis=1)
    upper = float(np.quantile(worst, ONE_SIDED[1]))
    point = float((costs.mean(axis=0) - np.asarray(tau)).max())
    return {"max_excess": point, "max_excess_upper95": upper,
            "verdict": joint_rule(upper, [r["verdict"] for r in rows], len(costs))}


def joint_rule(upper: float, verdicts: list[str], n: int) -> str:
    """The joint verdict from the bound of the largest excess and each constraint's own verdict (the one rule: the
    audit writes it, every reader checks it)."""
    from lara.stats import MIN_PROMPTS, TOO_FEW, VERDICTS

    if n < MIN_PROMPTS:
        return TOO_FEW
    if upper <= 0 and all(v == VERDICTS[0] for v in verdicts):  # (never met where one constraint is not:
        return VERDICTS[0]                                      # a rate's exact interval may be wider)
    return VERDICTS[2] if any(v == VERDICTS[2] for v in verdicts) else VERDICTS[1]


def edited_verdicts(audit: dict) -> list[str]:
    """Every verdict of a read audit that its own numbers do not give: each row's from its bounds and tau, each joint
    verdict from its rows (:func:`joint_rule`)."""
    from lara.stats import verdict_problems

    out = verdict_problems(audit.get("rows") or [], where="rows")
    for j in audit.get("joint") or []:
        own = [r["verdict"] for r in audit.get("rows") or [] if (r.get("method"), r.get("setting")) ==
               (j.get("method"), j.get("setting"))]
        want = joint_rule(j.get("max_excess_upper95", float("inf")), own, j.get("n_prompts", 0))
        if j.get("verdict") != want:
            out.append(f"joint ({j.get('method')} at {j.get('setting')}): verdict {j.get('verdict')!r}, but its rows "
                       f"and bound give {want!r}")
    return out


def _ci(mean: float, ci) -> str:
    return f"{mean:.4f} [{ci[0]:.4f}, {ci[1]:.4f}]"


def audit_lines(path, audit: dict) -> list[str]:
    """The audit as ``lara summary`` prints it (and audit-constraints logs it), after checking every verdict is the one
    its own numbers give (:func:`edited_verdicts`)."""
    from lara.read.files import DataError

    edited = edited_verdicts(audit)
    if edited:
        raise DataError(f"{path}: {edited[0]}: edited after lara audit-constraints wrote it; rerun the audit")
    lines = ["", f"held-out audit ({path}): each constraint's decoding cost (tau's units; a probability constraint's "
                 "rate with its Clopper-Pearson interval) and each judge's mean score"]
    joint = {(j["method"], j["setting"]): j["verdict"].split(" (")[0] for j in audit.get("joint") or []}
    for r in audit["rows"]:
        judges = "".join(f"; {r[f'judge{j}']} {_ci(r[f'judge{j}_mean'], r[f'judge{j}_ci95'])}"
                         for j in range(8) if f"judge{j}" in r)
        lines.append(f"  {r['method']:5} {r['setting']:18} {r['constraint']:10} {_ci(r['mean_cost'], r['ci95'])} vs "
                     f"tau {r['tau']:g}: {r['verdict'].split(' (')[0]}{judges}; joint "
                     f"{joint.get((r['method'], r['setting']), '?')}")
    judged = audit.get("judges")
    if not judged:
        return lines
    lines += ["", "  against lambda = 0 (paired on the test prompts; lower is better): the decoding scorer and each "
                  "judge"]
    lost = []
    for row in judged["paired"]:
        for j in row["judges"]:
            lines.append(f"    {row['method']:5} {row['setting']:18} {row['constraint']:10} scorer "
                         f"{_ci(row['scorer']['mean'], row['scorer']['ci95'])}; {j['judge']} "
                         f"{_ci(j['mean'], j['ci95'])}: {j['verdict']}")
            if j["verdict"] == "does not carry":
                lost.append(f"{row['method']} at {row['setting']} on {row['constraint']} ({j['judge']})")
    if lost:
        lines.append("  The scorer's improvement does NOT carry to the judge for: " + "; ".join(lost))
    if judged.get("note"):
        lines.append(f"  note: {judged['note']}")
    for a in judged["agreement"]:
        said = (f"undefined ({a['undefined']})" if "undefined" in a else
                f"Spearman {_ci(a['spearman'], a['spearman_ci'])}, top decile "
                f"{_ci(a['top_decile'], a['top_decile_ci'])}")
        lines.append(f"  agreement of {a['constraint']}'s scorer and {a['judge']} on {a['n']} responses: {said}")
    return lines


def judge_column(c, j: int) -> str:
    return f"judge{j}_{c.name}"


def audit(outputs: list[pd.DataFrame], constraints, n_boot: int, seed: int, judges: list[str] = ()
          ) -> tuple[pd.DataFrame, list[dict]]:
    """One row per (output, constraint) and one joint record per output."""
    from lara.stats import cost_audit, mean_interval, rate_audit

    rows, joint = [], []
    tau = [c.tau for c in constraints]
    for df in outputs:
        method, setting = str(df["method"].iloc[0]), str(df["setting"].iloc[0])
        per = []
        for c in constraints:
            row = (rate_audit(df[c.column], c.tau, df["reward"], n_boot, seed) if c.kind == "probability"
                   else cost_audit(df[c.column], c.tau, n_boot, seed, df["reward"]))
            ev = mean_interval(df[f"eval_{c.name}"], n_boot, seed) if f"eval_{c.name}" in df else (np.nan,) * 3
            row |= {"method": method, "setting": setting, "lambda": str(df["lambda"].iloc[0]), "constraint": c.name,
                    "kind": c.kind, "tau": c.tau, "eval_mean": ev[0], "eval_ci95": [ev[1], ev[2]]}
            for j, spec in enumerate(judges):
                mean, lo, hi = mean_interval(df[judge_column(c, j)], n_boot, seed)
                row |= {f"judge{j}": spec, f"judge{j}_mean": mean, f"judge{j}_ci95": [lo, hi]}
            per.append(row)
        rows += per
        joint.append({"method": method, "setting": setting, "lambda": str(df["lambda"].iloc[0]),
                      "n_prompts": len(df), **joint_verdict(df[[c.column for c in constraints]].to_numpy(float), tau,
                                                            per, n_boot, seed)})
    return pd.DataFrame(rows), joint


def check_judges(judges: list[str], costs: dict, reward: str, constraints) -> None:
    """Each ``--judge`` is named once, is a scorer the decoder never saw (never a constraint's decoding score or the
    decoding reward: :func:`lara.scorer_specs.judge_problem`) and takes each constraint's name as its role."""
    from lara.config import ConfigError
    from lara.scorer_specs import judge_problem, spec_problem

    for i, spec in enumerate(judges):
        if spec in judges[:i]:
            raise ConfigError(f"--judge {spec}: given twice")
        problem = judge_problem(spec, costs, reward) or next(
            (p for c in constraints if (p := spec_problem(spec, c.name))), None)
        if problem:
            raise ConfigError(f"--judge {spec}: {problem}")


def carried(scorer: dict, judge: dict) -> str:
    """Whether a decoder's improvement under its scorer (a paired difference against lambda = 0, lower is better)
    shows under a judge too."""
    if scorer["ci95"][1] >= 0:
        return "no scorer improvement"
    return "carries" if judge["ci95"][1] < 0 else "does not carry"


def judge_report(outputs: list[pd.DataFrame], constraints, judges: list[str], n_boot: int, seed: int) -> dict:
    """Every setting against its decoder at lambda = 0 under the decoding scorer and each judge (paired on the
    prompts), and each judge's agreement with each constraint's scorer on all audited responses."""
    from lara.evaluate.agreement import agreement
    from lara.stats import paired_difference

    zero = {str(df["method"].iloc[0]): df.set_index("prompt_id") for df in outputs
            if str(df["setting"].iloc[0]) == "zero"}
    paired = []
    for df in outputs:
        method, setting = str(df["method"].iloc[0]), str(df["setting"].iloc[0])
        if setting == "zero" or method not in zero:
            continue
        base = zero[method].loc[df["prompt_id"]]
        for c in constraints:
            scorer = paired_difference(df[c.column].to_numpy(), base[c.column].to_numpy(), n_boot, seed)
            row = {"method": method, "setting": setting, "constraint": c.name, "scorer": scorer}
            row["judges"] = []
            for j, spec in enumerate(judges):
                col = judge_column(c, j)
                judged = paired_difference(df[col].to_numpy(), base[col].to_numpy(), n_boot, seed)
                row["judges"].append({"judge": spec, **judged, "verdict": carried(scorer, judged)})
            paired.append(row)
    agree = []
    pooled = pd.concat(outputs, ignore_index=True)
    for c in constraints:
        for j, spec in enumerate(judges):
            scorer, judge = pooled[f"score_{c.name}"].to_numpy(float), pooled[judge_column(c, j)].to_numpy(float)
            row = {"constraint": c.name, "judge": spec, "responses": "every audited output, pooled", "n": len(scorer)}
            # else why it is undefined (agreement's ValueError: a constant side, as a probability constraint whose
            # decoders never pick a response above the threshold; too few defined resamples)
            try:
                row |= agreement(scorer, judge, n_boot, seed).to_dict()
            except ValueError as exc:
                row["undefined"] = str(exc)
            agree.append(row)
    missing = sorted({str(df["method"].iloc[0]) for df in outputs} - set(zero))
    note = (f"no lambda = 0 output of {', '.join(missing)} was audited: its settings have no paired differences"
            if missing else None)
    if note:
        log.warning("judges: %s", note)
    return {"specs": list(judges), "paired": paired, "agreement": agree, "note": note}


def add_arguments(parser) -> None:
    parser.add_argument("--responses", nargs="+", required=True, help="decoded outputs (lara decode-vector)")
    parser.add_argument("--constraints", required=True, help="JSON list of the constraints (calibration.constraints)")
    parser.add_argument("--lambda-json", required=True, help="the vector lambda record they were decoded with")
    parser.add_argument("--reward", required=True, help="the decoding reward scorer")
    parser.add_argument("--cost", action="append", default=[], metavar="NAME=SPEC",
                        help="a constraint's decoding cost scorer (tau's units), once per constraint")
    parser.add_argument("--evaluation", action="append", default=[], metavar="NAME=SPEC",
                        help="a constraint's evaluation scorer (its role is the constraint's name), once per "
                             "constraint")
    parser.add_argument("--judge", action="append", default=[], metavar="SPEC",
                        help="a judge the decoder never saw (evaluation.judges), scored with each constraint's name "
                             "as its role; once per judge")
    add_settings_arguments(parser, AuditSettings)
    parser.add_argument("--out", required=True, help="audit JSON")
    parser.add_argument("--table", required=True, help="audit CSV (one row per output and constraint)")


def check_output(art, record: dict, digest: str, constraints, scorers: dict, path) -> None:
    """A decoded output is what the audit is told it is: decode-vector's, for these constraints, on test prompts,
    decoded at the lambda its setting takes from this record (the record's digest, tau and Best-of-N size), and
    scored with the scorers the audit uses (the decoding costs are tau's units)."""
    from lara import identity
    from lara.constraints.decode import UNCERTIFIED, label, resolve_vector
    from lara.read.files import DataError

    art.expect("kind", "responses_vector", "a decoded output of lara decode-vector")
    art.expect("names", [c.name for c in constraints], "decoded for other constraints")
    setting = art.field("setting")
    if setting != "zero":
        art.expect("lambda_record", digest, f"decoded with another record than {path}")
        art.expect("tau", record["tau"], f"the taus {path} was calibrated for")
    base = str(setting).removesuffix(UNCERTIFIED)
    if label(base, record) != str(setting):
        raise DataError(f"--responses {art.path}: setting {setting}, but the {base} procedure of {path} "
                        f"{'certified nothing' if str(setting) == base else 'is certified'}: the name an output is "
                        "reported under says whether its lambda is certified")
    want = resolve_vector(base, record, len(constraints), path, uncertified=True)
    try:
        got = [float(x) for x in json.loads(str(art.field("lambda")))]
    except (TypeError, ValueError):
        raise DataError(f"--responses {art.path}: column 'lambda' {art.field('lambda')!r} is not a JSON list of "
                        "multipliers") from None
    if len(got) != len(want) or not np.allclose(got, want, rtol=1e-9, atol=1e-12):
        raise DataError(f"--responses {art.path}: {art.field('method')} at {setting} decoded at lambda {got}, "
                        f"expected {want} (the {setting} lambda of {path})")
    if art.field("method") == "bon":
        art.expect("n", record["decoder"]["n"], f"the Best-of-N size {path} was calibrated for")
    art.expect("reward_scorer", scorers["reward"], "decoded with another reward scorer than --reward")
    art.expect("cost_scorers", scorers["costs"], "decoded with other cost scorers than --cost: the audit's costs "
                                                 "must be the decoding costs, in tau's units")
    identity.expect_role(art.path, "--responses", "test", "the audit holds the test prompts out", art.identity)


def check_scorers(record: dict, reward: str, costs: dict, path) -> None:
    """The audit's decoding scorers are the ones the record was calibrated with (its identity keeps them): tau is in
    their units, and another scorer's verdict is about another cost."""
    from lara.read.files import DataError

    made = record.get("identity") or {}
    if made.get("reward_scorer") not in (None, reward):
        raise DataError(f"--reward {reward}: {path} was calibrated with the reward scorer {made['reward_scorer']!r}")
    kept = made.get("cost_scorers")
    if kept is not None and dict(kept) != dict(costs):
        name = next((n for n in costs if kept.get(n) != costs[n]), next(iter(kept), "?"))
        raise DataError(f"--cost {name}={costs.get(name)}: {path} was calibrated with {name}={kept.get(name)} "
                        f"(its scorers: {kept}); an audit by another scorer judges another cost")


def fill_columns(df: pd.DataFrame, own: list[str], constraints, specs: dict, scored) -> pd.DataFrame:
    """Each constraint's columns of an output: its decoding scorer's score (``score_<name>``; kept from a Best-of-N
    pick, else scored), its loss (``cost_<name>``), its evaluation and each judge's score."""
    for c in constraints:
        if c.column not in own:
            df[c.column] = scored(specs["costs"][c.name], c.name, df)
        same = specs["evals"][c.name] == specs["costs"][c.name]  # the evaluation is the decoding cost: not again
        df[f"eval_{c.name}"] = df[c.column] if same else scored(specs["evals"][c.name], c.name, df)
        df[f"score_{c.name}"] = df[c.column]
        df[c.column] = c.loss(df[c.column])
        for j, spec in enumerate(specs["judges"]):
            df[judge_column(c, j)] = scored(spec, c.name, df)
    return df


def run(args) -> None:
    from lara import identity
    from lara.constraints.decode import read_vector
    from lara.constraints.score import cost_specs
    from lara.constraints.spec import from_arg
    from lara.io import write_json
    from lara.provenance import code_version
    from lara.read.files import DataError, require_finite, write_table
    from lara.scoring import load_scorer, score_table
    from lara.stats import check_replicates

    s = read_settings(args, AuditSettings)
    check_replicates(s.bootstrap)
    constraints = from_arg(args.constraints)
    record = read_vector(args.lambda_json, constraints)
    costs = cost_specs(args.cost, constraints)
    evals = cost_specs(args.evaluation, constraints, "--evaluation")
    check_scorers(record, args.reward, costs, args.lambda_json)
    check_judges(args.judge, costs, args.reward, constraints)
    identity.distinct_files(args.responses, "--responses")
    scorers: dict = {}

    def scored(spec: str, role: str, df: pd.DataFrame) -> np.ndarray:
        if (spec, role) not in scorers:
            scorers[spec, role] = load_scorer(spec, role=role)
        v = score_table(scorers[spec, role], df["prompt"].tolist(), df["response"].tolist(), f"{spec} ({role})")
        if not np.all(np.isfinite(v)):
            raise DataError(f"{spec}: non-finite {role} scores")
        return v

    outputs, test = [], None
    digest = identity.file_digest(args.lambda_json)
    for path in args.responses:
        art = identity.table(path, "--responses",
                             required=("prompt_id", "prompt", "response", "method", "setting", "lambda"))
        check_output(art, record, digest, constraints, {"reward": args.reward, "costs": costs}, args.lambda_json)
        prompts = art.prompts(per_prompt=1)
        if test is None:
            test = prompts
        elif prompts.digest != test.digest:
            raise DataError(f"--responses {path}: other prompts than {args.responses[0]} (every output is audited on "
                            "the same test prompts)")
        df = art.df.copy()
        # a Best-of-N pick carries its candidate's reward and costs, scored by the scorers its identity names (just
        # checked against --reward and --cost): kept; anything else (ARGS, a file without them) is scored here
        kept = "reward_scorer" in art.identity and "cost_scorers" in art.identity
        own = [col for col in ("reward", *(c.column for c in constraints)) if kept and col in df]
        require_finite(df, own, path)
        if "reward" not in own:
            df["reward"] = scored(args.reward, "reward", df)
        outputs.append(fill_columns(df, own, constraints, {"costs": costs, "evals": evals, "judges": args.judge},
                                    scored))
    if test is not None:
        cal = (record.get("identity") or {}).get("prompts")
        overlap = identity.disjoint(cal, test, f"--responses {args.responses[0]}")
        if overlap:
            raise DataError(f"--responses {args.responses[0]}: {overlap} test prompts are calibration prompts of "
                            f"{args.lambda_json}: the audit would be in-sample")
    table, joint = audit(outputs, constraints, s.bootstrap, s.seed, args.judge)
    judged = judge_report(outputs, constraints, args.judge, s.bootstrap, s.seed) if args.judge else None
    made = identity.stamp("audit_constraints", args.out, names=[c.name for c in constraints], tau=record["tau"],
                          lambda_record=digest, prompts=None if test is None else test.record(),
                          made_from={"--lambda-json": args.lambda_json})
    doc = {"constraints": record["constraints"], "lambda_hat": record["lambda_hat"],
           "lambda_star": record["lambda_star"], "procedure": record["guarantee"]["procedure"],
           "rows": json.loads(table.to_json(orient="records")), "joint": joint, "judges": judged,
           "code": code_version(), identity.KEY: made}
    for line in audit_lines(args.out, doc):  # the audit as lara summary prints it
        if line:
            log.info("%s", line)
    write_json(args.out, doc)
    flat = table.assign(ci95_lo=table["ci95"].str[0], ci95_hi=table["ci95"].str[1],
                        upper95=table["one_sided95"].str[1]).drop(columns=["ci95", "one_sided95", "eval_ci95",
                                                                           "reward_ci95"])
    for j in range(len(args.judge)):
        flat[f"judge{j}_lo"], flat[f"judge{j}_hi"] = flat[f"judge{j}_ci95"].str[0], flat[f"judge{j}_ci95"].str[1]
        flat = flat.drop(columns=[f"judge{j}_ci95"])
    write_table(flat, args.table)
