"""``python -m jobs.submit --address http://HEAD:8265 [--follow] -- python -m jobs.X ARGS``: submit any job module.

Uses Ray's ``JobSubmissionClient`` (`bapsql.rollout.ray_shell.submit_job`) with a runtime_env read from
``--runtime-env`` (default cluster/runtime_env.yaml: working_dir = this repository, minus runs, caches, .git).
Prints the job id; with ``--follow`` streams the job's logs and exits 0 only if the job SUCCEEDED.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

REPO = Path(__file__).resolve().parents[1]
DEFAULT_RUNTIME_ENV = REPO / "cluster" / "runtime_env.yaml"


@click.command(context_settings={"help_option_names": ["-h", "--help"], "ignore_unknown_options": True})
@click.option("--address", required=True, metavar="URL",
              help="The cluster's job server (dashboard) address, e.g. http://127.0.0.1:8265.")
@click.option("--runtime-env", "runtime_env", default=str(DEFAULT_RUNTIME_ENV), show_default=True,
              type=click.Path(dir_okay=False), help="runtime_env YAML (working_dir is resolved against the repo).")
@click.option("--job-id", default=None, help="Submission id (default: Ray picks one).")
@click.option("--follow/--no-follow", default=False, help="Stream the job's logs and wait for it to end.")
@click.option("--timeout", "timeout_s", default=None, type=float, help="With --follow: stop waiting after N seconds.")
@click.argument("entrypoint", nargs=-1, required=True, type=click.UNPROCESSED)
def submit(address: str, runtime_env: str, job_id: str | None, follow: bool, timeout_s: float | None,
           entrypoint: tuple[str, ...]) -> None:
    """Submit ENTRYPOINT (e.g. `python -m jobs.sweep configs/experiments/cluster.yaml`) as a Ray job."""
    from bapsql.errors import BapsqlError

    if not Path(runtime_env).is_file():
        raise click.UsageError(f"--runtime-env {runtime_env!r} is not a file; pass a runtime_env YAML")
    if entrypoint[0] != "python" and not entrypoint[0].endswith("python3"):
        raise click.UsageError("ENTRYPOINT must be a python command, e.g. -- python -m jobs.sweep CONFIG")
    from bapsql.rollout.ray_shell import load_runtime_env, submit_job

    try:
        env = load_runtime_env(runtime_env, REPO)
        out = submit_job(address, shlex.join(entrypoint), runtime_env=env, job_id=job_id, follow=follow,
                         echo=click.echo if follow else None, timeout_s=timeout_s,
                         on_submitted=lambda sid: click.echo(f"submitted job {sid} to {address}"))
    except BapsqlError as exc:
        raise click.ClickException(str(exc)) from exc
    except ConnectionError as exc:
        raise click.ClickException(f"cannot reach the job server at {address}: {exc}") from exc
    click.echo(f"job {out.job_id}: {out.status}")
    if follow and not out.ok:
        sys.exit(1)


def main(argv: list[str] | None = None) -> None:
    submit.main(args=argv if argv is not None else sys.argv[1:], prog_name="python -m jobs.submit")


if __name__ == "__main__":
    main()
