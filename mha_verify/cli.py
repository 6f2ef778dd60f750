"""The `mha-verify` command line: argument parsing and exit codes.

Exit codes: 0 every check passed, 1 a check failed, 2 usage or input error (one line on
stderr, no traceback).
"""

from __future__ import annotations

import argparse
import sys

from mha_verify import __version__

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mha-verify",
        description="Property-based verification of multi-head attention layers and their ONNX exports.",
        epilog="Exit codes: 0 pass, 1 a check failed, 2 usage or input error.",
    )
    parser.add_argument("--version", action="version", version=f"mha-verify {__version__}")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    parser.parse_args(argv)
    parser.print_help()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
