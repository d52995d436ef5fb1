"""``lara figure``: the paper's figures (seaborn; PDF and PNG), each with a provenance sidecar.

One module per kind (``lambda_sweep`` is Fig. 1, ``tradeoff`` Fig. 2; then ``calibration``, ``decoders``, ``taus``,
``coverage``, ``deployment``, ``constraints``, ``constraints_sweep``, ``frontier``): its docstring says what the
figure draws.

Plot options (size, dpi, font scale, palette) are their own config slice, so changing one
redraws the figures and nothing else.

Each kind's module holds its drawing function, named as the kind, and its ``figure(args, opts, lam)``, which reads the
kind's inputs and draws them (a :class:`~.common.Drawn`). This module is the command: the flags each kind needs, the
scalar lambda.json, the figure's provenance and the files written. Shared: :mod:`.common` (the plot options and theme),
:func:`.decoders.read_audit` (the evaluation's constraint audit, the decoders and taus figures' input), :mod:`.vector`
(what the two constraints figures share) and :mod:`.provenance` (what a figure shows). The drawing functions and
:class:`FigureSettings` are importable from here (``from lara.evaluate.figures import taus`` is the taus figure's
drawing function, not its module; a module's names are imported as ``from lara.evaluate.figures.taus import ...``).
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path

from lara.evaluate.figures.calibration import calibration
from lara.evaluate.figures.common import FigureSettings, log
from lara.evaluate.figures.constraints import constraints
from lara.evaluate.figures.constraints_sweep import constraints_sweep
from lara.evaluate.figures.coverage import coverage
from lara.evaluate.figures.decoders import decoders
from lara.evaluate.figures.deployment import deployment
from lara.evaluate.figures.frontier import frontier
from lara.evaluate.figures.lambda_sweep import lambda_sweep
from lara.evaluate.figures.provenance import describe, summary_line
from lara.evaluate.figures.taus import taus
from lara.evaluate.figures.tradeoff import tradeoff
from lara.settings import add_settings_arguments, read_settings

__all__ = ["HELP", "KINDS", "OUTPUTS", "FigureSettings", "add_arguments", "calibration", "constraints",
           "constraints_sweep", "coverage", "decoders", "deployment", "frontier", "lambda_sweep", "run", "taus",
           "tradeoff"]

# the flags each kind needs (their destinations)
NEEDS = {"lambda_sweep": ("sweep", "lambda_json"), "tradeoff": ("summary",), "calibration": ("lambda_json",),
         "decoders": ("audit", "lambda_json"), "taus": ("audit", "lambda_json"), "coverage": ("coverage",),
         "deployment": ("report", "traces"), "constraints": ("lambda_json", "scores", "constraints"),
         "constraints_sweep": ("lambda_json", "scores", "audit", "constraints"), "frontier": ("frontier", "choice")}
KINDS = tuple(NEEDS)
HELP = f"draw a figure ({', '.join(KINDS)}) as PDF + PNG with a provenance sidecar"
# the kinds whose --lambda-json is the vector record (read by their own figure), not a scalar lambda.json
VECTOR_KINDS = ("constraints", "constraints_sweep")
INPUTS = ("sweep", "prune_sweep", "prune_lambda_json", "summary", "audit", "coverage", "report", "scores",
          "lambda_json", "frontier", "choice", "experiment_settings")

# every input flag (its destination) with its help, in --help's order; --traces takes one file per scenario
FLAGS = {"sweep": "Best-of-N sweep.csv (lambda_sweep)",
         "prune_sweep": "pruned Best-of-N's sweep.csv (lambda_sweep, optional: lara bon-prune-sweep)",
         "prune_lambda_json": "pruned Best-of-N's own record, which --prune-sweep was made with (lambda_sweep)",
         "lambda_json": "lambda.json (lambda_sweep, calibration; tradeoff: optional; constraints, constraints_sweep: "
                        "the vector record, constraints/lambda.json)",
         "summary": "eval summary.csv (tradeoff)",
         "audit": "eval constraint_audit.json (decoders, taus); the constraints stage's constraints/audit.json "
                  "(constraints_sweep)",
         "coverage": "calibration coverage.json (coverage)", "report": "deployment report.csv (deployment)",
         "traces": "deployment {scenario}/trace.parquet files, one per scenario (deployment)",
         "scores": "the constraints' calibration scores (constraints/calibration_scores.parquet: reward, cost_<name>) "
                   "the vector --lambda-json was calibrated on (constraints); the test prompts' scored Best-of-N "
                   "candidates, constraints/bon_scores.parquet (constraints_sweep)",
         "constraints": "JSON list of the constraints (calibration.constraints) (constraints, constraints_sweep)",
         "frontier": "the token-budget frontier, frontier.csv (lara choose-decoder --table) (frontier)",
         "choice": "the token-budget choice, choice.json (lara choose-decoder) (frontier)"}

OUTPUTS = ("png", "pdf", "provenance")  # the files this step writes (checked first: lara.cli.check_outputs)


def add_arguments(parser) -> None:
    parser.add_argument("--kind", required=True, choices=KINDS)
    for dest, text in FLAGS.items():
        parser.add_argument(f"--{dest.replace('_', '-')}", default=None, help=text,
                            **({"nargs": "+"} if dest == "traces" else {}))
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


def run(args) -> None:
    import matplotlib.pyplot as plt

    from lara.calibrate.record import read_lambda
    from lara.io import atomic_output
    from lara.trail import write_sidecar

    opts = read_settings(args, FigureSettings)
    inputs = inputs_of(args)
    # the constraints figures' record is a vector lambda (their read_vector_inputs), not a scalar lambda.json
    lam = read_lambda(args.lambda_json).data if args.lambda_json and args.kind not in VECTOR_KINDS else None
    # the kind's figure(args, opts, lam): reads the kind's inputs, draws them (lam: the scalar --lambda-json, or None)
    drawn = import_module(f"{__name__}.{args.kind}").figure(args, opts, lam)
    trail, shows = _shows(args, drawn, inputs, lam)
    line = summary_line(shows)
    for path, fmt, meta in ((args.png, "png", {"Description": line}),  # each atomically, ``line`` in its metadata
                            (args.pdf, "pdf", {"Subject": line, "CreationDate": None})):
        with atomic_output(path) as tmp:
            drawn.fig.savefig(tmp, format=fmt, dpi=opts.dpi, bbox_inches="tight", metadata={"Creator": "lara"} | meta)
    plt.close(drawn.fig)
    write_sidecar([args.png, args.pdf], inputs, args.rule, {"kind": args.kind, "options": opts.section()},
                  args.provenance, trail=trail, shows=shows)
    log.info("%s", line)
    log.info("wrote %s, %s and %s", args.png, args.pdf, args.provenance)
