"""The one reader: every ``lara`` command reads every input file (tables, records, sidecars, config files) through
this package, and nowhere else (``tests/unit/test_one_reader.py`` fails on a ``pd.read_*``, ``json.load`` of a file
or ``yaml.safe_load`` outside it).

* :mod:`lara.read.files`: the formats (parquet, CSV, JSON Lines, JSON, YAML) with their one-line errors;
* :mod:`lara.read.expect`: :func:`read` takes a declared expectation (:class:`Expect`: kind, role, columns, types,
  what makes a row a unit) and returns a typed :class:`~lara.identity.Artifact`; :func:`agree` checks that what
  several inputs of one command both name agrees;
* :mod:`lara.read.contracts`: the expectations of every command's inputs, in one table (docs/architecture.md prints
  it; the mutation suite, tests/unit/test_mutations.py, is generated from it).
"""
