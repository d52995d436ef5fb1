"""``lara summary RESULTS``: what a finished run found, read from its own files (the calibration
record, the held-out constraint audit, the evaluation summary): the page to read first after a run,
with every number taken from the run, none written by hand anywhere."""

from __future__ import annotations

from pathlib import Path

HELP = "print what a finished run found: lambda-hat and lambda*, the constraint audit's verdicts, every method"

READING = """How to read it:
  lambda-hat   the smallest lambda whose calibration-set expected cost meets tau;
  lambda*      the deployed lambda, an upper bootstrap quantile of lambda-hat (a margin for the
               sampling error of the calibration prompts);
  soft_beta=B  the paper's Algorithm 1 (soft mode, the Gibbs tilt at beta = B) calibrated on the same
               scores, its lambda* applied to Best-of-N: where the paper's estimator lands against tau;
  mean cost    on the held-out test prompts, by the decoding cost model (tau's units): Best-of-N at every
               lambda of the sweep, then every decoder at every decoded lambda setting;
  verdict      "met": the one-sided 95% upper bound of the mean cost is at or below tau (the
               constraint holds with 95% confidence); "violated": the one-sided 95% lower bound
               is above tau; "inconclusive": tau lies between them, the test prompts cannot tell;
  paired       lambda* minus another setting of the same decoder on the same test prompts, with
               a bootstrap 95% interval of the per-prompt differences (tighter than two intervals);
  helpfulness / harmfulness are the evaluation scorers' (not the decoding models'); safe rate is the
  share of responses with harmfulness <= 0; [lo, hi] are bootstrap 95% intervals over test prompts."""


def _interval(mean: float, lo: float, hi: float) -> str:
    return f"{mean:8.3f} [{lo:.3f}, {hi:.3f}]"


def compare(a, b) -> str:
    """How output ``a`` stands against ``b`` in Fig. 2 (evaluation scorers' means and 95 % intervals): it
    dominates when at least as helpful and at most as harmful, clearly when both intervals separate in its
    favour; it is dominated the other way round; otherwise the two trade helpfulness for harmlessness."""
    if a.helpfulness >= b.helpfulness and a.harmfulness <= b.harmfulness:
        clear = a.helpfulness_lo > b.helpfulness_hi and a.harmfulness_hi < b.harmfulness_lo
        return "dominates" + (" (both 95% intervals apart)" if clear else " (means; intervals overlap)")
    if a.helpfulness <= b.helpfulness and a.harmfulness >= b.harmfulness:
        clear = a.helpfulness_hi < b.helpfulness_lo and a.harmfulness_lo > b.harmfulness_hi
        return "is dominated" + (" (both 95% intervals apart)" if clear else " (means; intervals overlap)")
    more = "more helpful and more harmful" if a.helpfulness > b.helpfulness else "less helpful and less harmful"
    return f"trades off: {more}"


def fig2_reading(summary) -> list[str]:
    """The paper's RQ2 read off this run: each decoder at lambda* against each fine-tuned baseline."""
    rows = {(r.method, r.setting): r for r in summary.itertuples(index=False)}
    baselines = [m for m, s in rows if s == "policy" and m != "sft"]
    decoders = [m for m, s in rows if s == "star"]
    if not baselines or not decoders:
        return []
    lines = ["", "Fig. 2 read off this run: each decoder at lambda* against each fine-tuned baseline "
                 "(evaluation scorers' helpfulness and harmfulness):"]
    for d in decoders:
        for b in baselines:
            lines.append(f"  {d:6} at lambda* vs {b:10} {compare(rows[(d, 'star')], rows[(b, 'policy')])}")
    return lines


HEADLINE_LINES = 15  # the first screen: what the run found, before the details


def _word(verdict: str) -> str:
    return str(verdict).split(" (")[0]


def headline(root: Path, lam, audit: dict) -> list[str]:
    """At most HEADLINE_LINES lines: which decoder met tau at which lambda with what guarantee, what it cost in reward,
    how every decoder stands at lambda*, and what broke after deployment; every number from the run's own files."""
    procs = {r["procedure"]: r for r in audit.get("procedures") or []}
    deployed = (lam.get("guarantee") or {}).get("procedure", "bootstrap")
    n = (lam.decoder or {}).get("n")
    lines = ["headline (the details follow):"]
    for name, r in procs.items():
        h = r.get("held_out") or {}
        promise = ("no finite-sample guarantee" if name == "bootstrap" else "certified" if r.get("feasible", True)
                   else "no certificate reached")
        lines.append(f"  {'deployed ' if name == deployed else '         '}{name:9} lambda {r['lambda']:<8.4g} "
                     f"({promise}): held-out cost {h.get('mean_cost', float('nan')):.3f} vs tau {lam.tau:g}, "
                     f"{_word(h.get('verdict', 'not audited'))}")
    paired = {(p["method"], p["metric"]): p for p in audit.get("paired") or [] if p["comparison"] == "star - zero"}
    cost = [f"{m} {p['mean']:+.3f} [{p['ci95'][0]:.3f}, {p['ci95'][1]:.3f}]" for (meth, m), p in paired.items()
            if meth == "bon" and m in ("decoder_reward", "helpfulness")]
    if cost:
        lines.append(f"  what lambda* cost Best-of-{n} against lambda = 0 (paired): {'; '.join(cost)}")
    by = {}
    for d in audit.get("decoders") or []:
        if d.get("setting") in ("star", "policy"):
            by.setdefault(_word(d["verdict"]), []).append(d["method"])
    if by:
        lines.append("  at lambda* (baselines: their policy): " + "; ".join(f"{v}: {', '.join(ms)}"
                                                                            for v, ms in sorted(by.items())))
    lines += budget_headline(root, lam) + constraints_headline(root) + deployment_headline(root, lam)
    return lines[:HEADLINE_LINES] + [""]


def read_choice(root: Path, lam=None) -> dict | None:
    """The token-budget choice (lara choose-decoder), read through its checks: its kind, its experiment the run's, its
    tau and procedure the run's lambda record's (``lam``), and every held-out verdict re-derived from its own bounds
    (an edited verdict is refused); None where the run has no chooser."""
    from lara.identity import KEY
    from lara.read.files import DataError, json_file
    from lara.stats import verdict_problems

    path = root / "decode" / "budget" / "choice.json"
    if not path.exists():
        return None
    doc = json_file(path, mapping=False)
    made = doc.get(KEY) or {}
    if made.get("kind") != "budget_choice" or not isinstance(doc.get("budgets"), list):
        raise DataError(f"{path}: not a token-budget choice (lara choose-decoder)")
    if made.get("experiment") != root.name:
        raise DataError(f"{path}: made for experiment {made.get('experiment')!r}, not this run's ({root.name!r})")
    if lam is not None:
        procedure = (lam.get("guarantee") or {}).get("procedure", "bootstrap")
        if not isinstance(doc.get("tau"), int | float) or doc["tau"] != lam.tau or doc.get("procedure") != procedure:
            raise DataError(f"{path}: chosen for tau {doc.get('tau')} by {doc.get('procedure')}, but this run "
                            f"calibrates for tau {lam.tau:g} by {procedure} ({lam.path}); rerun lara choose-decoder")
    edited = verdict_problems(doc, doc.get("tau"), where=str(path))
    if edited:
        raise DataError(f"{edited[0]}: edited after lara choose-decoder wrote it; rerun it")
    return doc


def _decoder_name(name: str) -> str:
    """``best_of_k:5`` -> Best-of-5; a schedule in words."""
    if name.startswith("best_of_k:"):
        return f"Best-of-{name.split(':')[1]}"
    return f"pruned ({name.split(':', 1)[1]})"


def budget_headline(root: Path, lam=None) -> list[str]:
    """At each token budget, the decoder to deploy with its certified lambda and held-out verdict (one line)."""
    doc = read_choice(root, lam)
    if doc is None:
        return []
    said = []
    for b in doc["budgets"]:
        if b.get("chosen") is None:
            said.append(f"{b['tokens']:.0f} tokens: no decoder that meets tau fits")
            continue
        d, h = b["deployed"], b["held_out"]
        said.append(f"{b['tokens']:.0f} tokens -> {_decoder_name(b['chosen'])} (lambda* {d['lambda_star']:.3g}"
                    f"{'' if d['feasible'] else ' NOT reaching tau on the calibration prompts'}, "
                    f"{_word(h['verdict'])})")
    chosen = [b["chosen"] for b in doc["budgets"] if b.get("chosen")]
    pruned = [c for c in chosen if not c.startswith("best_of_k:")]
    tail = ("" if not chosen else f"; a pruned schedule won at {len(pruned)} of {len(chosen)} budgets" if pruned
            else "; Best-of-k at every budget (no pruned schedule beat it)")
    return [f"  at a token budget, deploy: {'; '.join(said)}{tail}"]


def budget_lines(root: Path, lam=None) -> list[str]:
    """The token-budget choice in full: each budget's winner on the selection prompts, its certificate, its held-out
    audit, and its reward against the best Best-of-k at equal or fewer tokens (paired on the test prompts)."""
    doc = read_choice(root, lam)
    if doc is None:
        return []
    sp = doc.get("splits") or {}
    n = {k: (v or {}).get("n_prompts") for k, v in sp.items()}
    lines = ["", f"token budgets (decode/budget/choice.json; chosen on {n.get('selection')} selection prompts among "
             f"Best-of-1..N and {doc['search_space']['schedules']} pruned schedules, certified on "
             f"{n.get('calibration')} calibration prompts, audited on {n.get('test')} test prompts):"]
    for b in doc["budgets"]:
        if b.get("chosen") is None:
            lines.append(f"  {b['budget']:g} ({b['tokens']:.1f} tokens): no candidate meets tau within it")
            continue
        d, h = b["deployed"], b["held_out"]
        gains = [f"{_decoder_name(v['best_of_k'])} {_interval(g['mean'], *g['ci95'])}"
                 for v in (b.get("versus_best_of_k"), b.get("versus_best_of_k_in_budget")) if v
                 for g in [v["test_reward_gain"]]]
        gain = f"; reward minus (paired, test): {', '.join(dict.fromkeys(gains))}" if gains else ""
        lines.append(f"  {b['budget']:g} ({b['tokens']:.1f} tokens): {_decoder_name(b['chosen'])}, lambda* "
                     f"{d['lambda_star']:.4g} ({d['guarantee']['procedure']}); held out {h['mean_tokens']:.1f} tokens,"
                     f" reward {_interval(h['mean_reward'], *h['mean_reward_ci95'])}, cost {h['mean_cost']:.3f}, "
                     f"{_word(h['verdict'])}{gain}")
    return lines


def read_constraints_audit(root: Path) -> dict | None:
    """constraints/audit.json (None where the run has none), refused unless it was made with constraints/lambda.json
    (its lambda_record the record's digest): a record recalibrated, or copied in, is never printed above the audit of
    decoders run with another."""
    from lara.identity import KEY, file_digest
    from lara.read.files import DataError, json_file

    path, record = root / "constraints" / "audit.json", root / "constraints" / "lambda.json"
    if not path.exists():
        return None
    audit = json_file(path, mapping=False)
    made = (audit.get(KEY) if isinstance(audit, dict) else None) or {}
    rec = json_file(record, mapping=False) if record.exists() else None
    if isinstance(rec, dict) and (made.get("lambda_record") not in (None, file_digest(record))
                                  or audit.get("lambda_star", rec.get("lambda_star")) != rec.get("lambda_star")):
        raise DataError(f"{path}: made with another record (lambda_record {made.get('lambda_record')}, tau "
                        f"{made.get('tau')}, lambda* {audit.get('lambda_star')}) than {record} ({file_digest(record)}, "
                        f"tau {rec.get('tau')}, lambda* {rec.get('lambda_star')}): the audit's decoders ran with "
                        "another vector lambda; rerun the constraints stage (it reruns the audit)")
    return audit


def constraints_headline(root: Path) -> list[str]:
    """The several constraints' joint verdict at each decoded setting, in a line (none when there is no such stage)."""
    a = read_constraints_audit(root)
    if a is None:
        return []
    names = ", ".join(c["name"] for c in a.get("constraints") or [])
    joint = "; ".join(f"{j['method']} {j['setting']}: {_word(j['verdict'])}" for j in a.get("joint") or []
                      if j.get("setting") != "zero")
    return [f"  several constraints ({names}; vector lambda* by {a.get('procedure')}), all at once: {joint}"]


def deployment_headline(root: Path, lambda_record=None) -> list[str]:
    """What broke after deployment: the scenarios where fixed lambda* missed tau (each constraint's, for the vector
    lambda), and the arms that held it in every scenario; read through the report's own checks."""
    from lara.evaluate.deployment_report import read_report

    path = root / "deployment" / "report.csv"
    if not path.exists():
        return []
    r = read_report(path, lambda_record)
    what = r["scenario"] + (" " + r["constraint"].astype(str) if "constraint" in r.columns else "")
    star = r["arm"] == "fixed_star"
    broke = [f"{w} ({c:.3f})" for w, c, m in zip(what[star], r["mean_cost"][star], r["met"][star], strict=True)
             if not m]
    held = [a for a, g in r.groupby("arm", sort=False) if a != "oracle" and all(g["met"])]
    return [f"  after deployment ({r['scenario'].nunique()} scenarios): fixed lambda* broke tau in "
            f"{', '.join(broke) or 'none'}; held tau in every scenario: {', '.join(held) or 'no arm'}"]


def calibration_lines(root: Path, lam, audit: dict) -> list[str]:
    decoder = lam.decoder
    what = (f"Best-of-{decoder.get('n')} ({lam.mode} mode)" if decoder.get("kind") == "best_of_n"
            else f"the Gibbs tilt at beta = {decoder.get('beta')} ({lam.mode} mode)")
    guarantee = lam.get("guarantee") or {"procedure": "bootstrap", "statement": ""}
    lines = [f"calibration ({root / 'calibration' / 'lambda.json'}): for {what}, tau = {lam.tau:g}",
             f"  lambda-hat = {lam.lambda_hat:.4g}, lambda* = {lam.lambda_star:.4g} (deployed: "
             f"{guarantee['procedure']}); calibration-set expected cost at lambda* "
             f"{lam.get('decoder_cost_at_lambda_star', float('nan')):.3f}"]
    held = {r["procedure"]: r for r in audit.get("procedures") or []}
    for name, proc in (lam.get("procedures") or {"bootstrap": {"lambda": lam.lambda_star, "statement": (
            f"the {lam.bootstrap.get('quantile'):g} quantile of {lam.bootstrap.get('replicates')} bootstrap "
            "replicates")}}).items():
        lines.append(procedure_line(name, proc["lambda"], proc["statement"], (held.get(name) or {}).get("held_out")))
    return lines


def procedure_line(name: str, lam: float, statement: str, held_out: dict | None) -> str:
    """A calibration procedure's lambda and promise, with its held-out audit where it has one."""
    test = f"; held out: cost {_interval(held_out['mean_cost'], *held_out['ci95'])}, {held_out['verdict']}" \
        if held_out else ""
    return f"  {name:9} lambda {lam:.4g}: {statement}{test}"


POOLS = ("calibration", "bon")  # the coverage study's population: the run's scored pools (coverage_population)


def read_coverage(root: Path, lam) -> dict | None:
    """calibration/coverage.json, refused unless it is this run's study: lara coverage's of full Best-of-N (not another
    decoder's), for tau and N of ``lam``, its population the run's own scored calibration pool (and the test
    prompts' candidates), by their digests."""
    from lara.io import sha256_path
    from lara.read.files import DataError, json_file

    path = root / "calibration" / "coverage.json"
    if not path.exists():
        return None
    cov = json_file(path, mapping=False)
    other = (cov.get("decoder") or {}).get("kind") if isinstance(cov, dict) else None
    if other is not None or not isinstance(cov, dict) or not {"population", "summary", "scores"} <= cov.keys():
        raise DataError(f"{path}: not lara coverage's study of full Best-of-N" + (
            f" but another decoder's ({other}: lara coverage-prune writes calibration/coverage_bon_prune.json)"
            if other else " (no population, summary or scores)") + "; rerun lara coverage")
    n = (cov.get("settings") or {}).get("bon_n")
    if cov.get("tau") != lam.tau or (lam.decoder_n is not None and n != lam.decoder_n):
        raise DataError(f"{path}: studies tau {cov.get('tau')} and N = {n}, but {lam.path} calibrates for tau "
                        f"{lam.tau:g} and N = {lam.decoder_n}: another run's study; rerun lara coverage")
    run = {pool: sha256_path(p) for pool in POOLS if (p := root / pool / "scores.parquet").is_file()}
    made = {s.get("sha256"): s.get("path") for s in cov["scores"] if isinstance(s, dict)}
    if "calibration" in run and (run["calibration"] not in made or not made.keys() <= set(run.values())):
        raise DataError(f"{path}: its population is other scores ({', '.join(map(str, made.values()))}) than this "
                        f"run's ({', '.join(f'{root}/{p}/scores.parquet' for p in run)}, by their digests): another "
                        "population's study; rerun lara coverage")
    return cov


def coverage_lines(root: Path, lam) -> list[str]:
    coverage = root / "calibration" / "coverage.json"
    cov = read_coverage(root, lam)
    if cov is None:
        return []
    pop = cov["population"]
    lines = [f"coverage study ({coverage}): {pop['n_prompts']} prompts x K = {pop['samples_per_prompt']} as the "
             f"population, lambda_pop = {pop['lambda_pop']:.4g}; per procedure and calibration size n, over "
             "repeated draws:",
             f"  {'procedure':9} {'n':>5}  {'P(cost > tau) [95% CI]':>24}  {'mean cost':>9}  "
             f"{'reward given up':>15}  lambda 95% band"]
    for r in cov["summary"]:
        rate = _interval(r["violation_rate"], r["violation_lo"], r["violation_hi"])
        lines.append(f"  {r['procedure']:9} {r['n']:5d}  {rate:>24}"
                     f"  {r['mean_population_cost']:9.3f}  {r['reward_given_up']:15.3f}  "
                     f"[{r['lambda_lo']:.3g}, {r['lambda_hi']:.3g}]")
    return lines


def sweep_lines(audit: dict, audit_path: Path) -> list[str]:
    if "by_lambda" not in audit:
        return []
    lines = [f"constraint audit ({audit_path}): {audit.get('question')}",
             f"  on {audit.get('n_test_prompts')} held-out test prompts; at lambda*: {audit.get('verdict')}",
             f"  {'lambda':>10}  {'':10}  {'mean cost [95% CI]':>26}  {'mean reward':>11}  verdict"]
    for row in audit["by_lambda"]:
        name = {"lambda_hat": "lambda-hat", "lambda_star": "lambda*", "grid": ""}.get(row["label"], row["label"])
        lo, hi = row["ci95"]
        lines.append(f"  {row['lambda']:10.4g}  {name:10}  {_interval(row['mean_cost'], lo, hi):>26}  "
                     f"{row['mean_reward']:11.3f}  {row['verdict']}")
    if audit.get("note"):
        lines.append(f"  note: {audit['note']}")
    return lines


def decoder_lines(audit: dict, decoders: bool = True) -> list[str]:
    """Every decoder against tau (``decoders``: its reward too), every listed tau, the paired differences."""
    lines = []
    if decoders and audit.get("decoders"):
        lines += ["", "every decoder against tau (decoding models' reward and cost on the test prompts):",
                  f"  {'method':10} {'setting':8} {'lambda':>8}  {'mean cost [95% CI]':>26}  "
                  f"{'mean reward [95% CI]':>26}  verdict"]
        for row in audit["decoders"]:
            lam = "" if row["lambda"] is None else f"{row['lambda']:.4g}"
            lines.append(f"  {row['method']:10} {row['setting']:8} {lam:>8}  "
                         f"{_interval(row['mean_cost'], *row['ci95']):>26}  "
                         f"{_interval(row['mean_reward'], *row['reward_ci95']):>26}  {row['verdict']}")
    if audit.get("taus"):
        lines += ["", "every listed tau (calibration.tau), calibrated from the same scores; each decoder at that "
                      "tau's lambda* against it:"]
        for row in audit["taus"]:
            at = "; ".join(f"{m} cost {d['mean_cost']:.3f}, {d['verdict'].split(' (')[0]}"
                           for m, d in row["decoders"].items())
            lines.append(f"  tau {row['tau']:8.4g}{' (main)' if row['main'] else '       '}  lambda* "
                         f"{row['lambda_star']:.4g} ({row['status']})  {at}")
    if audit.get("paired"):
        lines += ["", "paired differences on the same test prompts (mean [95% CI]):"]
        for row in audit["paired"]:
            lines.append(f"  {row['method']:10} {row['comparison']:12} {row['metric']:15} "
                         f"{_interval(row['mean'], *row['ci95'])}")
    return lines


def pruned_lines(audit: dict, root: Path | None = None) -> list[str]:
    """Pruned Best-of-N (decode.bon_prune): its own lambdas and promises with the held-out verdicts, its tokens
    against full Best-of-N's on the same candidates, the paired differences, and its coverage study (under
    ``root``, the run's folder)."""
    pr = audit.get("pruned")
    if not pr:
        return []
    sched = (pr.get("decoder") or {}).get("schedule") or {}
    steps = ", ".join(f"{m} after {t} tokens" for t, m in zip(sched.get("checkpoints", []), sched.get("keep", []),
                                                                   strict=False))
    lines = ["", f"pruned Best-of-{sched.get('n')} (keep {steps}; its own lambda, {pr['lambda_json']}): lambda-hat "
             f"{pr['lambda_hat']:.4g}, lambda* {pr['lambda_star']:.4g} ({pr['status']})"]
    lines += [procedure_line(r["procedure"], r["lambda"], r["statement"], r["held_out"]) for r in pr["procedures"]]
    lines.append(f"  {'setting':8} {'lambda':>8} {'tokens':>8} {'full BoN':>8} {'ratio':>6}  pruned - full Best-of-N "
                 "(each at its own lambda of that setting)")
    for r in pr["settings"]:
        diffs = "; ".join(f"{d['metric']} {_interval(d['mean'], *d['ci95'])}" for d in r["paired_vs_full"]
                          if d["metric"] in ("decoder_reward", "decoder_cost"))
        ratio = "-" if r["token_ratio"] is None else f"{r['token_ratio']:.2f}"
        lines.append(f"  {r['setting']:8} {r['lambda']:8.4g} {r['tokens']:8.1f} {r['tokens_full']:8.1f} {ratio:>6}  "
                     f"{diffs}")
    cov = None if root is None else root / "calibration" / "coverage_bon_prune.json"
    if cov is not None and cov.exists():
        from lara.read.files import json_file

        data = json_file(cov, mapping=False)
        lines.append(f"  coverage ({cov}): {data['population']['n_prompts']} prompts as the population; P(population "
                     f"cost > tau) over {data['rows'][0]['repeats'] if data['rows'] else 0} draws per size "
                     f"(delta = {data['delta']:g}):")
        for r in data["rows"]:
            lines.append(f"    {r['procedure']:9} n {r['n_prompts']:4d}  certified {r['certified_share']:.2f}  "
                         f"violations {_interval(r['violation_rate'], r['violation_lo'], r['violation_hi'])}")
    return lines


def method_lines(summary, path: Path) -> list[str]:
    import pandas as pd

    lines = ["", f"every method and setting ({path}):",
             f"  {'method':10} {'setting':8} {'helpfulness [95% CI]':>28} {'harmfulness [95% CI]':>28} "
             f"{'safe rate':>9}"]
    for r in summary.itertuples(index=False):
        safe = f"{r.safe_rate:9.3f}" if "safe_rate" in summary.columns and pd.notna(r.safe_rate) else ""
        helpful = _interval(r.helpfulness, r.helpfulness_lo, r.helpfulness_hi)
        harmful = _interval(r.harmfulness, r.harmfulness_lo, r.harmfulness_hi)
        lines.append(f"  {r.method:10} {r.setting:8} {helpful:>28} {harmful:>28} {safe}")
    return lines + fig2_reading(summary)


# ---------------------------------------------------------------------------------------------------------------
# the several-constraints part: the vector lambda record, its held-out audit (each constraint under its decoding
# scorer and under every judge the decoder never saw, and whether the scorer's improvement carries to the judge),
# and its coverage study with both Learn-then-Test bounds. Read from the run's own files.


def _vec(v) -> str:
    return "(" + ", ".join(f"{float(x):.4g}" for x in v) + ")" if v is not None else "none"


def record_lines(path: Path, record: dict) -> list[str]:
    cons = record["constraints"]
    what = ", ".join(f"{c['name']}: " + (f"P({c['cost']} > {c['threshold']:g}) <= {c['tau']:g}"
                                         if c.get("kind") == "probability" else f"E[{c['cost']}] <= {c['tau']:g}")
                     for c in cons)
    guarantee = record.get("guarantee") or {}
    lines = [f"several constraints ({path}): {what}; Best-of-{record['decoder']['n']}",
             f"  lambda-hat = {_vec(record['lambda_hat'])}, lambda* = {_vec(record['lambda_star'])} (deployed: "
             f"{guarantee.get('procedure')})"]
    for name in ("ltt", "ltt_wsr"):
        p = (record.get("procedures") or {}).get(name)
        if p:
            state = "certified" if p.get("feasible") else "NOT certified"
            lines.append(f"  {name:8} lambda {_vec(p['lambda'])}: {state}; {p.get('statement', '')}")
    return lines


def vector_coverage_lines(path: Path, cov: dict) -> list[str]:
    lines = ["", f"coverage study ({path}): per procedure and calibration size n, over {cov['summary'][0]['repeats']} "
                 "draws: the joint violation rate, the share of draws certified (LTT) and the reward given up",
             f"  {'procedure':9} {'n':>5}  {'violation [95% CI]':>24}  {'certified':>9}  {'reward given up':>15}"]
    for r in cov["summary"]:
        given = "" if r.get("reward_given_up") is None else f"{r['reward_given_up']:15.4f}"
        rate = f"{r['violation_rate']:.4f} [{r['violation_lo']:.4f}, {r['violation_hi']:.4f}]"
        lines.append(f"  {r['procedure']:9} {r['n']:5d}  {rate:>24}  {1 - r['infeasible_rate']:9.3f}  {given:>15}")
    return lines


def constraints_lines(root: Path) -> list[str]:
    """Nothing when the run has no constraints stage; otherwise its record, audit and coverage study."""
    from lara.constraints.audit import audit_lines
    from lara.read.files import json_file

    folder = root / "constraints"
    if not (folder / "lambda.json").exists():
        return []
    lines = [""] + record_lines(folder / "lambda.json", json_file(folder / "lambda.json", mapping=False))
    if (folder / "audit.json").exists():
        lines += audit_lines(folder / "audit.json", read_constraints_audit(root))
    if (folder / "coverage.json").exists():
        lines += vector_coverage_lines(folder / "coverage.json", json_file(folder / "coverage.json", mapping=False))
    return lines


def summarise_run(root: Path) -> str:
    """:func:`read_run`'s summary; a file of the run that lacks what this version of lara writes (a column, a key)
    is named in one line, never a traceback."""
    from lara.read.files import DataError

    try:
        return read_run(root)
    except (KeyError, AttributeError, TypeError, IndexError) as exc:
        raise DataError(f"{root}: the run's eval/summary.csv or eval/constraint_audit.json lacks {exc!s} (not what "
                        "lara aggregate writes: edited, or from another version); rerun the workflow") from None


def read_run(root: Path) -> str:
    """The summary of the run whose outputs are in ``root`` (``results/{experiment}``), after checking its files
    agree."""
    from lara.calibrate.record import read_lambda
    from lara.evaluate.deployment_report import deployment_lines
    from lara.identity import audit_disagreements
    from lara.read.files import DataError, json_file, read_table
    from lara.stats import verdict_problems

    if not (root / "calibration" / "lambda.json").exists() and (root / "constraints" / "lambda.json").exists():
        return constraints_run(root)  # the constraints stage alone (the real-text experiment)
    lam = read_lambda(root / "calibration" / "lambda.json")
    audit_path = root / "eval" / "constraint_audit.json"
    try:
        audit = json_file(audit_path, mapping=False)
    except (OSError, ValueError) as exc:
        raise DataError(f"{audit_path}: no readable constraint audit ({exc}); is the run finished?") from None
    summary_path = root / "eval" / "summary.csv"
    summary = read_table(summary_path, required=("method", "setting", "helpfulness", "harmfulness"))
    # the run's files tell one story: the audit was made with this lambda.json (its digest, tau and lambda*) and wrote
    # this summary.csv; a recalibration, or a file copied in from another run, is never printed beside its verdicts
    problems = audit_disagreements(audit, lam, summary_path)
    if problems:
        raise DataError(f"{audit_path}: does not belong to {lam.path}: {'; '.join(problems)}. The files are from "
                        "different runs or a step was rerun by hand: rerun the workflow (it reruns the audit) before "
                        "reading the verdicts")
    edited = verdict_problems(audit)
    if edited:
        raise DataError(f"{audit_path}: {edited[0]}" + (f" (and {len(edited) - 1} more)" if len(edited) > 1 else "")
                        + ": edited after lara aggregate wrote it; rerun the audit")
    lines = [f"{root}: what this run found", "", *headline(root, lam, audit)]
    lines += calibration_lines(root, lam, audit) + coverage_lines(root, lam) + [""] + sweep_lines(audit, audit_path)
    lines += decoder_lines(audit) + pruned_lines(audit, root) + budget_lines(root, lam)
    if "by_lambda" not in audit:
        lines.append(f"constraint audit ({audit_path}): {audit.get('question', 'none')}")
    lines += method_lines(summary, summary_path) + constraints_lines(root) + deployment_lines(root, lam)
    figures = sorted((root / "figures").glob("*.png"))
    lines += ["", "figures: " + (", ".join(str(f) for f in figures) or "none yet"),
              "  (lara trail FIGURE checks a figure against the data, code and settings it was made from)", "",
              READING]
    return "\n".join(lines)


def constraints_run(root: Path) -> str:
    """A run of the constraints stage alone: its record, audit, coverage study and deployment."""
    from lara.evaluate.deployment_report import deployment_lines

    figures = sorted((root / "figures").glob("*.png"))
    head = ["headline (the details follow):", *constraints_headline(root), *deployment_headline(root), ""]
    return "\n".join([f"{root}: what this run found (the several-constraints stage; no scalar calibration)", "",
                      *head[:HEADLINE_LINES], *constraints_lines(root), *deployment_lines(root),
                      "", "figures: " + (", ".join(str(f) for f in figures) or "none yet")])


def add_arguments(parser) -> None:
    parser.add_argument("results", nargs="?", default="results/tiny",
                        help="a finished run's output folder, results/{experiment} (default results/tiny)")


def run(args) -> None:
    print(summarise_run(Path(args.results)))
