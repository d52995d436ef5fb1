"""``lara figure``: the paper's figures (seaborn; PDF and PNG), each with a provenance sidecar.

* ``lambda_sweep`` (Fig. 1): mean reward and mean cost of Best-of-N against lambda, tau as a
  dashed line, lambda-hat and lambda* marked with the bootstrap interval;
* ``tradeoff`` (Fig. 2): helpfulness against harmlessness for every method and setting, one
  panel for the model evaluation and one for the LLM judge (a note when no judge ran);
* ``calibration``: the empirical dual g(lambda), its derivative g'(lambda) and the bootstrap
  histogram of lambda-hat;
* ``decoders``: every decoder's held-out mean reward and cost by the decoding models (tau's units)
  against lambda, at each decoded lambda setting, with tau and the audit's verdicts;
* ``taus``: lambda*(tau) for every listed calibration.tau, and Best-of-N at each lambda* on the held-out test
  prompts against tau;
* ``coverage``: the coverage study (``lara coverage``): each procedure's violation rate and reward given up
  against the calibration size n;
* ``deployment``: lambda after deployment, one column per scenario: each arm's running mean cost against
  the visit t with tau (top) and its lambda_t (bottom).
* ``constraints``: several constraints at once (``lara calibrate-vector``). Two constraints: the feasible region
  of the vector lambda in (lambda_1, lambda_2), every grid point's exact mean expected Best-of-N cost of each
  constraint on the calibration prompts, each constraint's boundary at its tau, the mean reward faint, the ray
  searched and every procedure's lambda; any other number: each constraint's cost (and the reward) along that ray.
* ``constraints_sweep``: Fig. 1 per constraint for the vector lambda, on the held-out test prompts: each
  constraint's mean Best-of-N decoder cost along the ray lambda = s d (the candidate ``lara decode-vector`` picks),
  its tau, and the mean reward; lambda-hat and lambda* marked, every audited output (``lara audit-constraints``:
  Best-of-N and ARGS at each setting) at the s of its lambda with its 95 % interval.
* ``frontier``: the token-budget chooser (``lara choose-decoder``): held-out mean reward against tokens per prompt,
  each decoder at its own certified lambda* (Best-of-k for k = 1..N as a line, the pruned schedules as points, each
  with its 95 % interval; hollow where the held-out verdict is not met), a dashed line at each budget and a star on
  the decoder chosen at it.

Plot options (size, dpi, font scale, palette) are their own config slice, so changing one
redraws the figures and nothing else.

One module per kind (``lambda_sweep``, ``tradeoff``, ``calibration``, ``decoders``, ``taus``, ``coverage``,
``deployment``, ``constraints``, ``constraints_sweep``, ``frontier``): its drawing function, named as the kind, and its
``figure(args, opts, lam)``, which reads the kind's inputs and draws them (a :class:`~.common.Drawn`). This module is
the command: the flags each kind needs, the scalar lambda.json, the figure's provenance and the files written.
Shared: :mod:`.common` (the plot options and theme), :mod:`.audit` (the evaluation's constraint audit, the decoders
and taus figures' input), :mod:`.vector` (what the two constraints figures share), :mod:`.constraints_sweep_inputs`
and :mod:`.provenance` (what a figure shows). The drawing functions and :class:`FigureSettings` are importable from
here (``from lara.evaluate.figures import taus`` is the taus figure's drawing function, not its module; a
module's names are imported as ``from lara.evaluate.figures.taus import ...``).
"""

from __future__ import annotations

from pathlib import Path

from lara.evaluate.figures.calibration import calibration
from lara.evaluate.figures.calibration import figure as draw_calibration
from lara.evaluate.figures.common import FigureSettings, log
from lara.evaluate.figures.constraints import constraints
from lara.evaluate.figures.constraints import figure as draw_constraints
from lara.evaluate.figures.constraints_sweep import constraints_sweep
from lara.evaluate.figures.constraints_sweep import figure as draw_constraints_sweep
from lara.evaluate.figures.coverage import coverage
from lara.evaluate.figures.coverage import figure as draw_coverage
from lara.evaluate.figures.decoders import decoders
from lara.evaluate.figures.decoders import figure as draw_decoders
from lara.evaluate.figures.deployment import deployment
from lara.evaluate.figures.deployment import figure as draw_deployment
from lara.evaluate.figures.frontier import figure as draw_frontier
from lara.evaluate.figures.frontier import frontier
from lara.evaluate.figures.lambda_sweep import figure as draw_lambda_sweep
from lara.evaluate.figures.lambda_sweep import lambda_sweep
from lara.evaluate.figures.provenance import describe, summary_line
from lara.evaluate.figures.taus import figure as draw_taus
from lara.evaluate.figures.taus import taus
from lara.evaluate.figures.tradeoff import figure as draw_tradeoff
from lara.evaluate.figures.tradeoff import tradeoff
from lara.settings import add_settings_arguments, read_settings

__all__ = ["HELP", "KINDS", "OUTPUTS", "FigureSettings", "add_arguments", "calibration", "constraints",
           "constraints_sweep", "coverage", "decoders", "deployment", "frontier", "lambda_sweep", "run", "taus",
           "tradeoff"]

HELP = ("draw a figure (lambda_sweep, tradeoff, calibration, decoders, taus, coverage, deployment, constraints, "
        "constraints_sweep, frontier) as PDF + PNG with a provenance sidecar")

# each kind's figure(args, opts, lam): reads the kind's inputs, draws them (lam: the scalar --lambda-json, or None)
FIGURES = {"lambda_sweep": draw_lambda_sweep, "tradeoff": draw_tradeoff, "calibration": draw_calibration,
           "decoders": draw_decoders, "taus": draw_taus, "coverage": draw_coverage, "deployment": draw_deployment,
           "constraints": draw_constraints, "constraints_sweep": draw_constraints_sweep,
           "frontier": draw_frontier}
KINDS = tuple(FIGURES)
# the flags each kind needs (their destinations)
NEEDS = {"lambda_sweep": ("sweep", "lambda_json"), "tradeoff": ("summary",), "calibration": ("lambda_json",),
         "decoders": ("audit", "lambda_json"), "taus": ("audit", "lambda_json"), "coverage": ("coverage",),
         "deployment": ("report", "traces"), "constraints": ("lambda_json", "scores", "constraints"),
         "constraints_sweep": ("lambda_json", "scores", "audit", "constraints"), "frontier": ("frontier", "choice")}
# the kinds whose --lambda-json is the vector record (read by their own figure), not a scalar lambda.json
VECTOR_KINDS = ("constraints", "constraints_sweep")
INPUTS = ("sweep", "prune_sweep", "prune_lambda_json", "summary", "audit", "coverage", "report", "scores",
          "lambda_json", "frontier", "choice", "experiment_settings")

OUTPUTS = ("png", "pdf", "provenance")  # the files this step writes (checked first: lara.cli.check_outputs)


def add_arguments(parser) -> None:
    parser.add_argument("--kind", required=True, choices=KINDS)
    parser.add_argument("--sweep", default=None, help="Best-of-N sweep.csv (lambda_sweep)")
    parser.add_argument("--prune-sweep", default=None,
                        help="pruned Best-of-N's sweep.csv (lambda_sweep, optional: lara bon-prune-sweep)")
    parser.add_argument("--prune-lambda-json", default=None,
                        help="pruned Best-of-N's own record, which --prune-sweep was made with (lambda_sweep)")
    parser.add_argument("--lambda-json", default=None,
                        help="lambda.json (lambda_sweep, calibration; tradeoff: optional; constraints, "
                        "constraints_sweep: the vector record, constraints/lambda.json)")
    parser.add_argument("--summary", default=None, help="eval summary.csv (tradeoff)")
    parser.add_argument("--audit", default=None, help="eval constraint_audit.json (decoders, taus); the constraints "
                        "stage's constraints/audit.json (constraints_sweep)")
    parser.add_argument("--coverage", default=None, help="calibration coverage.json (coverage)")
    parser.add_argument("--report", default=None, help="deployment report.csv (deployment)")
    parser.add_argument("--traces", nargs="+", default=None,
                        help="deployment {scenario}/trace.parquet files, one per scenario (deployment)")
    parser.add_argument("--scores", default=None,
                        help="the constraints' calibration scores (constraints/calibration_scores.parquet: reward, "
                        "cost_<name>) the vector --lambda-json was calibrated on (constraints); the test prompts' "
                        "scored Best-of-N candidates, constraints/bon_scores.parquet (constraints_sweep)")
    parser.add_argument("--constraints", default=None,
                        help="JSON list of the constraints (calibration.constraints) (constraints, "
                        "constraints_sweep)")
    parser.add_argument("--frontier", default=None,
                        help="the token-budget frontier, frontier.csv (lara choose-decoder --table) (frontier)")
    parser.add_argument("--choice", default=None, help="the token-budget choice, choice.json (lara choose-decoder) "
                        "(frontier)")
    add_settings_arguments(parser, FigureSettings)
    parser.add_argument("--rule", default="figure", help="the rule name recorded in the provenance sidecar")
    parser.add_argument("--experiment-settings", default=None,
                        help="the experiment's settings table (results/{exp}/settings.tsv): recorded, hashed, in the "
                        "figure's provenance")
    parser.add_argument("--png", required=True)
    parser.add_argument("--pdf", required=True)
    parser.add_argument("--provenance", required=True, help="the sidecar .provenance.json")


def inputs_of(args) -> list[str]:
    """The files the figure is drawn from, for its provenance (every flag the kind needs given, else a
    :class:`~lara.read.files.DataError` naming the missing ones)."""
    from lara.read.files import DataError

    missing = [f"--{n.replace('_', '-')}" for n in NEEDS[args.kind] if getattr(args, n) is None]
    if missing:
        raise DataError(f"figure {args.kind} needs {', '.join(missing)}")
    return [getattr(args, n) for n in INPUTS if getattr(args, n) is not None] + (args.traces or [])


def _shows(args, drawn, inputs: list[str], lam: dict | None) -> tuple[list[dict], dict]:
    """The trail of the figure's inputs and what the figure shows (:func:`~.provenance.describe`, what the kind's
    figure adds, the settings table)."""
    from lara.trail import build_trail

    figure_dir = Path(args.png)
    trail = build_trail(inputs, made_under=None if figure_dir.is_absolute() else figure_dir.parts[0])
    shows = describe(args.kind, trail, lam, drawn.summary) | (drawn.extra or {})
    if args.experiment_settings:
        shows["settings_table"] = args.experiment_settings
    return trail, shows


def _save(fig, args, opts: FigureSettings, line: str) -> None:
    """The PNG and the PDF, each written atomically with ``line`` in its metadata."""
    from lara.io import atomic_output

    for path, fmt in ((args.png, "png"), (args.pdf, "pdf")):
        meta = {"Creator": "lara", "Description": line} if fmt == "png" else \
            {"Creator": "lara", "Subject": line, "CreationDate": None}
        with atomic_output(path) as tmp:
            fig.savefig(tmp, format=fmt, dpi=opts.dpi, bbox_inches="tight", metadata=meta)


def run(args) -> None:
    import matplotlib.pyplot as plt

    from lara.calibrate.record import read_lambda
    from lara.trail import write_sidecar

    opts = read_settings(args, FigureSettings)
    inputs = inputs_of(args)
    # the constraints figures' record is a vector lambda (their read_vector_inputs), not a scalar lambda.json
    lam = read_lambda(args.lambda_json).data if args.lambda_json and args.kind not in VECTOR_KINDS else None
    drawn = FIGURES[args.kind](args, opts, lam)
    trail, shows = _shows(args, drawn, inputs, lam)
    line = summary_line(shows)
    _save(drawn.fig, args, opts, line)
    plt.close(drawn.fig)
    write_sidecar([args.png, args.pdf], inputs, args.rule, {"kind": args.kind, "options": opts.section()},
                  args.provenance,
                  trail=trail, shows=shows)
    log.info("%s", line)
    log.info("wrote %s, %s and %s", args.png, args.pdf, args.provenance)
