"""``python -m jobs.sweep CONFIG [--out DIR] [--address ADDR]``: an evaluation sweep (same options as ``bapsql sweep``).

Submitted to a cluster with ``python -m jobs.submit --address http://HEAD:8265 -- python -m jobs.sweep CONFIG``,
it joins the cluster it runs in (``ray.init(address="auto")`` via the config's ``ray.address``, or ``--address``)."""

from __future__ import annotations

import sys

from bapsql.cli.sweep import sweep_cmd


def main(argv: list[str] | None = None) -> None:
    sweep_cmd.main(args=argv if argv is not None else sys.argv[1:], prog_name="python -m jobs.sweep")


if __name__ == "__main__":
    main()
