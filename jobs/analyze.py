"""``python -m jobs.analyze RUN [RUN ...] --out DIR``: the offline analysis job (same options as ``bapsql analyze``)."""

from __future__ import annotations

import sys

from bapsql.cli.analyze import analyze


def main(argv: list[str] | None = None) -> None:
    analyze.main(args=argv if argv is not None else sys.argv[1:], prog_name="python -m jobs.analyze")


if __name__ == "__main__":
    main()
