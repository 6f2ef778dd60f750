"""The exit codes of every ``mha-verify`` subcommand, in one place (the README's "Exit codes" lists them)."""

EXIT_OK = 0  # every check passed (or was declared, warned or not applicable, with at least one pass)
EXIT_FAIL = 1  # a check failed, or nothing was verified
EXIT_USAGE = 2  # a usage or input error: one line on stderr, no traceback, no partial file
EXIT_INTERRUPTED = 130  # interrupted by the user (SIGINT)
EXIT_TERMINATED = 143  # ended by SIGTERM (a CI cancelling the job), every worker process ended too


def usage_error(message: str) -> int:
    """Say a usage error on one line of stderr (control characters escaped); the exit code for it."""
    import sys

    from mha_verify.escape import printable

    print(printable(f"mha-verify: error: {message}"), file=sys.stderr)
    return EXIT_USAGE
