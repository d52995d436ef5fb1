#!/usr/bin/env bash
# Post-deploy script of every rule group's conda environment (`snakemake --sdm conda`; Snakemake runs
# envs/<group>.post-deploy.sh, a link to this file, inside the new environment): lara itself, installed
# editable from the checkout that runs the workflow (LARA_SOURCE, exported by rules/common.smk). The
# environment's own `lara` then runs the checkout's code, as the code hashes in the rules' params assume;
# its dependencies are the environment file's pins (tests/unit/test_envs.py keeps them equal to pyproject.toml).
set -euo pipefail
: "${LARA_SOURCE:?not set: the workflow (rules/common.smk) exports the checkout it runs from}"
python -m pip install --no-deps --quiet --editable "${LARA_SOURCE}"
python -c "import lara.cli" && command -v lara >/dev/null
