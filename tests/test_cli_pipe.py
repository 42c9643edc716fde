"""The CLI under a closed pipe: `gradfidelity ... | head` must stop quietly, not print a traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# A subcommand that writes far more than a pipe's buffer (64 KiB on Linux), so the write after the reader has gone
# raises BrokenPipeError inside the real main().
_SCRIPT = textwrap.dedent(
    """
    import sys
    import gradfidelity.cli as cli

    real = cli.build_parser

    def build_parser():
        parser = real()
        sub = next(a for a in parser._actions if a.dest == "command")
        flood = sub.add_parser("flood")
        flood.set_defaults(func=lambda args: [print(f"line {i}") for i in range(200_000)] and 0)
        return parser

    cli.build_parser = build_parser
    sys.exit(cli.main(["flood"]))
    """
)


def test_closed_pipe_exits_quietly_with_sigpipe_status():
    proc = subprocess.Popen([sys.executable, "-c", _SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"line 0\n"
    proc.stdout.close()  # what `head -1` does after its line
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr


def test_open_pipe_still_gets_every_line():
    # the handler must not swallow output when nobody closes the pipe
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, check=True).stdout
    assert out.count(b"\n") == 200_000
