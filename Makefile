# Two entry points (see README): `make run` and `make test`. Both create the virtual environment
# on first use (pip, with torch pinned through constraints.txt) and reuse it afterwards.
PYTHON ?= python3
VENV   := .venv
STAMP  := $(VENV)/.installed
CORES  ?= all
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: run test env

env: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $@

run: $(STAMP)
	snakemake --cores $(CORES)

test: $(STAMP)
	pytest
