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

    def flood(args):
        for i in range(200_000):
            print(f"line {i}")

    def broken_elsewhere(args):
        print("before")
        raise BrokenPipeError("a worker's pipe")  # stdout is fine: this failure must stay loud

    def build_parser():
        parser = real()
        sub = next(a for a in parser._actions if a.dest == "command")
        sub.add_parser("flood").set_defaults(func=flood)
        sub.add_parser("broken-elsewhere").set_defaults(func=broken_elsewhere)
        return parser

    cli.build_parser = build_parser
    sys.exit(cli.main(sys.argv[1:]))
    """
)


def test_closed_pipe_exits_quietly_with_sigpipe_status():
    proc = subprocess.Popen([sys.executable, "-c", _SCRIPT, "flood"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"line 0\n"
    proc.stdout.close()  # what `head -1` does after its line
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr


def test_open_pipe_still_gets_every_line():
    # the handler must not swallow output when nobody closes the pipe
    out = subprocess.run([sys.executable, "-c", _SCRIPT, "flood"], capture_output=True, check=True).stdout
    assert out.count(b"\n") == 200_000


def test_a_broken_pipe_other_than_stdout_stays_loud():
    # the claim is false here: stdout's reader is still there, so the error is a real failure, not `| head`
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, "broken-elsewhere"], capture_output=True)
    assert proc.returncode == 1
    assert proc.stdout == b"before\n"
    assert "BrokenPipeError: a worker's pipe" in proc.stderr.decode()
