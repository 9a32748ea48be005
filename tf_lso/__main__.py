"""The `python -m tf_lso` commands.

`python -m tf_lso run SCRIPT.py [args...]` installs the legacy mixed-precision
names (`tf_lso.install()`) and runs an unmodified TF 2.x script as
`__main__`, with `sys.argv` set to the script and its arguments.

`python -m tf_lso check PATH...` reports legacy mixed-precision code and what
behaves differently on TF 2.16+ (exit status 1 when a finding reaches
`--fail-on`); `--fix` previews rewriting the legacy names to tf_lso's as a
diff, `--fix --write` applies it. See docs/migration.md. It imports no
TensorFlow. Installed, both are also the `tf-lso` command.
"""

import argparse
import os
import runpy
import sys

from tf_lso._migration import report

_RUN_EXAMPLE = "{prog} run old_train.py --epochs 3"
_CHECK_EXAMPLES = (
    "  {prog} check src/ notebooks/\n"
    "  {prog} check --format sarif --fail-on warning src/ > tf_lso.sarif\n"
    "  {prog} check --fix src/            # preview the rewrite\n"
    "  {prog} check --fix --write src/    # apply it (needs tf_lso[migrate])"
)


def main(argv=None, prog="python -m tf_lso"):
    """Runs a command; returns the exit status (argparse exits with 2)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run TF 2.1-2.4 mixed-precision code on current "
        "TensorFlow, with the legacy names provided by tf_lso.",
        epilog=f"examples:\n  {_RUN_EXAMPLE.format(prog=prog)}\n"
        f"{_CHECK_EXAMPLES.format(prog=prog)}\nsee docs/migration.md",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run", help="run a script with tf_lso.install() in effect",
        description="Runs an unmodified TF 2.1-2.4 script as __main__ with "
        "tf_lso.install() in effect: the legacy mixed-precision names "
        "resolve to tf_lso's.",
        epilog=f"example:\n  {_RUN_EXAMPLE.format(prog=prog)}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("script", help="the Python script to run")
    script_args = run.add_argument(
        "args", nargs=argparse.REMAINDER,
        help="arguments passed on to the script (optional)")
    script_args.required = False  # argparse would list it as required.
    check = commands.add_parser(
        "check", help="report legacy mixed-precision code; --fix rewrites "
        "the legacy names to tf_lso's",
        description="Reports legacy mixed-precision code and what behaves "
        "differently on TF 2.16+ / Keras 3. Needs no TensorFlow.",
        epilog=f"examples:\n{_CHECK_EXAMPLES.format(prog=prog)}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("paths", nargs="+", metavar="PATH",
                       help=".py or .ipynb files, or directories to search")
    check.add_argument(
        "--format", choices=("text", "json", "sarif"), default="text",
        help="text (default), json, or sarif (SARIF 2.1.0, for code scanning "
        "annotations on pull requests)")
    check.add_argument(
        "--select", action="append", default=[], metavar="RULES",
        help="report only these rules (comma-separated ids; repeatable)")
    check.add_argument(
        "--ignore", action="append", default=[], metavar="RULES",
        help="do not report these rules (comma-separated ids; repeatable). "
        "A `# tf-lso: ignore[rule-id]` comment ignores one line")
    check.add_argument(
        "--fail-on", choices=("info", "warning", "error", "never"),
        default="error", help="exit with status 1 if a finding has this "
        "severity or a higher one (default: error)",
    )
    check.add_argument("--fix", action="store_true",
                       help="show the rewrite of legacy names as a diff "
                       "(needs tf_lso[migrate])")
    check.add_argument("--write", action="store_true",
                       help="with --fix: write the rewritten files")
    args = parser.parse_args(argv)
    if args.command == "check":
        if args.write and not args.fix:
            check.error("--write needs --fix")
        try:
            args.select = report.rule_ids(args.select)
            args.ignore = report.rule_ids(args.ignore)
        except ValueError as e:
            check.error(str(e))
        for path in args.paths:
            if not os.path.exists(path):
                check.error(f"no such file or directory: {path!r}")
        return _check(args)

    if not os.path.isfile(args.script):
        run.error(f"no such file: {args.script!r}")
    import tf_lso

    tf_lso.install()
    sys.argv = [args.script] + args.args
    # As `python SCRIPT.py` would: the script's directory comes first.
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.script)))
    runpy.run_path(args.script, run_name="__main__")
    return 0


def _check(args):
    from tf_lso._migration import check

    if args.fix:
        from tf_lso._migration import fix

        try:
            diff, changed, skipped = fix.fix_files(
                args.paths, write=args.write)
        except ImportError as e:
            print(e, file=sys.stderr)
            return 2
        sys.stdout.write(diff)
        for path, reason in skipped:
            print(f"{path}: skipped: {reason}", file=sys.stderr)
        verb = "rewrote" if args.write else "would rewrite"
        hint = "" if args.write or not changed else " (apply with --write)"
        print(f"{verb} {len(changed)} file(s){hint}", file=sys.stderr)
        return 1 if skipped and any(
            not reason.startswith("notebooks") for _, reason in skipped) else 0
    files = list(check.python_files(args.paths))
    findings = report.selected(
        [f for path in files for f in check.check_file(path)],
        args.select, args.ignore)
    write = {"json": report.json_report, "sarif": report.sarif,
             "text": report.text}[args.format]
    print(write(findings, len(files)))
    return 1 if report.fails(findings, args.fail_on) else 0


def console_main():
    """The `tf-lso` console script: `tf-lso check ...`, `tf-lso run ...`."""
    sys.exit(main(prog="tf-lso"))


if __name__ == "__main__":
    sys.exit(main())
