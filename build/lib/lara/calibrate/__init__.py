"""LARA calibration: the dual objective in lambda, its bisection and the prompt bootstrap
(``lara.calibrate.dual``, pure numpy), and the ``lara calibrate`` command."""
