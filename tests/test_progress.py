"""Progress of long work: plain lines where rich draws nothing live (logs, nohup, CI), a bar on a terminal."""

import io

from rich.console import Console

from bapsql.progress import Progress, progress_text


def test_the_plain_line_says_done_share_elapsed_and_time_left():
    assert progress_text("sweep r", 12, 120, 60.0) == "sweep r: 12/120 (10%), elapsed 1.0 min, about 9.0 min left"
    assert progress_text("sweep r", 120, 120, 600.0) == "sweep r: 120/120 (100%), elapsed 10.0 min"


def test_a_log_console_gets_a_line_per_share_and_a_last_line():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    with Progress(console, "sweep r", 100, step=0.25, interval_s=1e9) as bar:
        for i in range(1, 100):
            bar.update(i)
        bar.advance()
    lines = out.getvalue().splitlines()
    assert [line.split(":")[1].split("(")[0].strip() for line in lines] == ["25/100", "50/100", "75/100", "100/100"]


def test_no_console_is_silent_and_a_terminal_gets_a_bar():
    with Progress(None, "x", 3) as bar:
        bar.advance(3)
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with Progress(console, "sweep r", 4) as bar:
        bar.update(4, description="sweep r (done)")
    assert "sweep r (done)" in out.getvalue() and "4/4" in out.getvalue()
