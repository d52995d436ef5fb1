"""The data error every reader raises (here, so the table reader and the id checks share it without importing
each other)."""


class DataError(ValueError):
    """Bad input data; the message names the file and, where it applies, the column and row."""
