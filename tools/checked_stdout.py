"""checked_stdout.py: standard output for the tools' Python scripts, where a write that fails (a full
disk, a closed pipe) ends the program with exit 2 and a message, never a traceback or a silent 0.

    import checked_stdout
    checked_stdout.run("my-tool", main, sys.argv)   # main returns the exit code
"""
import os
import sys


class CheckedStdout:
    """Wraps sys.stdout; write() and flush() exit 2 on an OSError (also for argparse's --help)."""

    def __init__(self, prog, stream):
        self._prog, self._stream = prog, stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except (OSError, ValueError, AttributeError) as e:  # ValueError: closed; AttributeError: no stdout
            self._fail(e)

    def flush(self):
        try:
            if self._stream is not None:
                self._stream.flush()
        except (OSError, ValueError) as e:
            self._fail(e)

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def _fail(self, e):
        # Point the real output at /dev/null, so that the interpreter's own flush at exit does not
        # fail again with a traceback of its own.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        why = getattr(e, "strerror", None) or "it is closed"
        sys.stderr.write(f"{self._prog}: cannot write to standard output ({why}); check where it goes\n")
        raise SystemExit(2)


def install(prog):
    if not isinstance(sys.stdout, CheckedStdout):
        sys.stdout = CheckedStdout(prog, sys.stdout)


def run(prog, main, *args):
    """Calls main(*args) with a checked standard output, flushes it, and exits with main's code."""
    install(prog)
    try:
        code = main(*args)
    except SystemExit as e:  # argparse after --help or a usage error: the help must reach stdout too
        code = e.code
    sys.stdout.flush()
    sys.exit(code)
