"""LARA: Lagrangian Reward Augmentation for safe inference-time alignment.

The packaged steps of the workflow. Each stage is a subpackage (``lara.data``,
``lara.toy``, ...) whose modules expose a pure core plus a thin command behind
the ``lara`` console script (``lara --help``).
"""

__version__ = "0.1.0"
