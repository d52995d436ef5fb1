"""Several constraints at once (``calibration.constraints``): a vector lambda for Best-of-N and ARGS.

The stage is additive: the scalar pipeline (one cost, ``calibration.tau``) runs as before, and when
``calibration.constraints`` lists constraints the stage under ``results/{exp}/constraints/`` scores the
calibration and Best-of-N samples with one cost per constraint, calibrates a vector lambda (exact along a ray,
jointly certified), decodes r - sum_j lambda_j c_j and audits every constraint and their conjunction.
See docs/constraints.md; the numerics live in :mod:`lara.calibrate.vector`.
"""
