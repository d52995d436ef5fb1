"""``lara coverage-vector``: the coverage study of the vector lambda (placeholder being written)."""

HELP = "coverage study of the vector lambda: joint violation rate of each procedure against delta"


def add_arguments(parser) -> None:
    parser.add_argument("--out", required=True)


def run(args) -> None:
    raise NotImplementedError("lara coverage-vector is being written")
