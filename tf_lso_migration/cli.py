"""The `python -m tf_lso` commands, and the `tf-lso` console script.

`python -m tf_lso run SCRIPT.py [args...]` installs the legacy mixed-precision
names (`tf_lso.install()`) and runs an unmodified TF 2.x script as
`__main__`, with `sys.argv` set to the script and its arguments.

`python -m tf_lso check PATH...` reports legacy mixed-precision code and what
behaves differently on TF 2.16+ (exit status 1 when a finding reaches
`--fail-on`); `--fix` previews rewriting the legacy names to tf_lso's as a
diff, `--fix --write` applies it, both only where `check` with the same
options reports a fixable finding. Defaults come from `[tool.tf-lso]` in
pyproject.toml (`tf_lso_migration/config.py`). `python -m tf_lso rule [ID]`
prints a rule's documentation. See docs/migration.md. Installed, all are
also the `tf-lso` command (`console_main`).

Standard library only, as the whole package: `check` and `rule` import
neither TensorFlow nor tf_lso; `run` imports tf_lso when it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import re
import runpy
import sys
import tempfile
import textwrap
import traceback
from collections.abc import Iterator
from collections.abc import Sequence
from typing import NoReturn
from typing import TextIO

import tf_lso_migration
from tf_lso_migration import config as config_lib
from tf_lso_migration import report
from tf_lso_migration import rules

_RUN_EXAMPLE = "{prog} run old_train.py --epochs 3"
_CHECK_EXAMPLES = (
    "  {prog} check src/ notebooks/\n"
    "  {prog} check --format sarif --fail-on warning src/ > tf_lso.sarif\n"
    "  {prog} check --route tf-keras src/ # TF_USE_LEGACY_KERAS=1 code\n"
    "  {prog} check --fix src/            # preview the rewrite\n"
    "  {prog} check --fix --write src/    # apply it (needs LibCST)\n"
    "  {prog} rule legacy-name            # what a rule finds, and why"
)
_NO_MEANING_WITH_FIX = ("has no meaning with --fix (it prints a diff, or "
                        "writes the files with --write)")


def _rules_epilog(prog: str) -> str:
    ids = textwrap.fill(", ".join(rules.RULES), width=76,
                        break_on_hyphens=False,
                        initial_indent="  ", subsequent_indent="  ")
    return (f"rules (`{prog} rule ID` explains one):\n{ids}\n"
            "settings: [tool.tf-lso] in pyproject.toml (select, ignore, "
            "fail-on,\n  exclude, route); an option given here overrides "
            "its key")


def _more(prog: str) -> str:
    # What an installed tool has: a wheel holds no docs/.
    return textwrap.fill(
        f"more: `{prog} rule` lists the rules, `{prog} rule ID` explains one "
        "and what to write instead; tf_lso's migration guide is \"Migrating "
        "TF 2.1–2.4 loss scaling code to tf_lso\" in the project's "
        "documentation", width=76, subsequent_indent="  ")


def _ids(values: Sequence[str]) -> list[str]:
    return [part.strip() for value in values for part in value.split(",")
            if part.strip()]


def main(argv: Sequence[str] | None = None,
         prog: str = "python -m tf_lso") -> int:
    """Runs a command; returns the exit status (argparse exits with 2)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run TF 2.1-2.4 mixed-precision code on current "
        "TensorFlow, with the legacy names provided by tf_lso; check a code "
        "base for what needs changing.",
        epilog=f"examples:\n  {_RUN_EXAMPLE.format(prog=prog)}\n"
        f"{_CHECK_EXAMPLES.format(prog=prog)}\n{_rules_epilog(prog)}\n"
        f"{_more(prog)}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {tf_lso_migration.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run", help="run a script with tf_lso.install() in effect",
        description=textwrap.fill(
            "Runs an unmodified TF 2.1-2.4 script as __main__ with "
        "tf_lso.install() in effect: the legacy mixed-precision names "
        "resolve to tf_lso's. It shows what the script prints; TensorFlow's "
        "start-up log (its C++ notices, and on a machine without a GPU an "
        "error-level line about cuInit) is hidden. With TF_CPP_MIN_LOG_LEVEL "
        "set in the environment, only what is below that level is hidden "
        "(0: nothing; 1: notices; 2: warnings too), also the start-up "
        "lines TensorFlow prints whatever the level. What TensorFlow logs "
        "while the script runs is shown as with `python script.py` (on "
        "most CPUs, a float16 script's first op logs an error-level "
        "oneDNN notice about DT_HALF: TF_CPP_MIN_LOG_LEVEL=3 hides it).",
        79),
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
        epilog=f"examples:\n{_CHECK_EXAMPLES.format(prog=prog)}\n"
        f"{_rules_epilog(prog)}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("paths", nargs="+", metavar="PATH",
                       help=".py or .ipynb files, or directories to search")
    check.add_argument(
        "--format", choices=("text", "json", "sarif"),
        help="text (default), json, or sarif (SARIF 2.1.0, for code scanning "
        "annotations on pull requests)")
    check.add_argument(
        "--select", action="append", metavar="RULES",
        help="report only these rules (comma-separated ids; repeatable)")
    check.add_argument(
        "--ignore", action="append", metavar="RULES",
        help="do not report these rules (comma-separated ids; repeatable). "
        "A `# tf-lso: ignore[rule-id]` comment ignores one line")
    check.add_argument(
        "--fail-on", choices=config_lib.FAIL_ON,
        help="exit with status 1 if a finding has this severity or a higher "
        "one (default: error)",
    )
    check.add_argument(
        "--route", choices=rules.ROUTES,
        help="what tf.keras is where the code will run: keras3 (default) or "
        "tf-keras (tf_keras 2.x, TF_USE_LEGACY_KERAS=1); only what holds "
        "there is reported")
    check.add_argument(
        "--exclude", action="append", metavar="PATTERNS",
        help="leave out paths matching these globs (comma-separated; "
        "repeatable), also files named")
    check.add_argument(
        "--config", metavar="PYPROJECT",
        help="the pyproject.toml to read [tool.tf-lso] from (default: the "
        "first one with that table in the current directory or above)")
    check.add_argument("--fix", action="store_true",
                       help="show the rewrite of legacy names as a diff "
                       "(needs LibCST)")
    check.add_argument("--write", action="store_true",
                       help="with --fix: write the rewritten files")
    rule = commands.add_parser(
        "rule", help="explain a rule (every rule without an id)",
        description="Prints a rule's documentation: what it finds, why, "
        "what to write instead, and the routes it holds on.",
        epilog=_rules_epilog(prog),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rule.add_argument("id", nargs="?", metavar="ID", help="the rule id")
    args = parser.parse_args(argv)
    if args.command == "run":
        return _run(args, run, prog)
    try:
        if args.command == "rule":
            status = _rule(args, rule)
        else:
            status = _check(_check_settings(args, check), prog)
        sys.stdout.flush()
    except BrokenPipeError:
        # `tf-lso check ... | head`: the reader is gone. As Python's docs
        # advise, no traceback, and no second error at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return status


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser,
         prog: str) -> int:
    if not os.path.isfile(args.script):
        parser.error(f"no such file: {args.script!r}")
    try:
        with _start_up_log_hidden():
            # The runtime: only `run` needs it. `install()` first: without
            # TensorFlow it says what to install.
            import tf_lso

            tf_lso.install()
            import tensorflow as tf
            # Finding the devices logs too (on a machine without a GPU, an
            # error-level line about cuInit); it does not start the
            # runtime, so the script can still configure its devices.
            tf.config.list_physical_devices()
    except ImportError as e:  # No (or an old) TensorFlow: what to install.
        print(f"{prog} run: error: {e}", file=sys.stderr)
        return 1
    sys.argv = [args.script] + args.args
    # As `python SCRIPT.py` would: the script's directory comes first.
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.script)))
    try:
        runpy.run_path(args.script, run_name="__main__")
    except Exception as error:
        # As `python SCRIPT.py` shows it: from the script's first frame
        # (none for a syntax error), not from `run`'s and runpy's.
        frames = error.__traceback__
        while frames is not None and (
                frames.tb_frame.f_code.co_filename != args.script):
            frames = frames.tb_next
        traceback.print_exception(type(error), error, frames)
        return 1
    return 0


# A line of TensorFlow's C++ log, and its severity: absl's format (TF
# 2.18+), or the one before it.
_TF_LOG_LINE = re.compile(
    r"((?P<absl>[IWEF])\d{4} \d\d:\d\d:\d+\.\d+ +\d+ "
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: (?P<old>[IWEF]) )\S+:\d+\] ")
_SEVERITIES = "IWEF"  # TF_CPP_MIN_LOG_LEVEL's 0 to 3.
# Lines of the log in no such format, and their severity.
_TF_LOG_NOTICES = {
    "WARNING: All log messages before absl::InitializeLog() is called are "
    "written to STDERR": "W",
    # The second line of the CPU features notice.
    "To enable the following instructions:": "I",
}


def _severity(line: str) -> str | None:
    """The severity (I, W, E, F) of a line of TensorFlow's C++ log, or
    None for any other line."""
    match = _TF_LOG_LINE.match(line)
    if match:
        return match.group("absl") or match.group("old")
    return next((severity for start, severity in _TF_LOG_NOTICES.items()
                 if line.startswith(start)), None)


@contextlib.contextmanager
def _start_up_log_hidden() -> Iterator[None]:
    """Hides TensorFlow's C++ start-up log below TF_CPP_MIN_LOG_LEVEL, and
    all of it but fatal lines when that is not set.

    TensorFlow logs its notices (oneDNN, CUDA, CPU features, the cuInit
    error of a machine without a GPU) while it is imported and finds its
    devices, some whatever TF_CPP_MIN_LOG_LEVEL says (TF 2.21). Whatever
    else is written to stderr meanwhile (a Python warning) is shown after,
    and all of it if starting fails.
    """
    level = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3")
    shown = _SEVERITIES[int(level) if level in ("0", "1", "2") else 3:]
    if shown == _SEVERITIES:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        failed = True
        try:
            yield
            failed = False
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            log.seek(0)
            lines = log.read().decode(errors="replace").splitlines(True)
            sys.stderr.write("".join(
                line for line in lines
                if failed or _severity(line) in (None, *shown)))
            sys.stderr.flush()


def _rule(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.id is None:
        width = max(map(len, rules.RULES))
        for rule in rules.RULES.values():
            print(f"{rule.id:<{width}}  {rule.severity:<7}  {rule.summary}")
        return 0
    if args.id not in rules.RULES:
        parser.error(f"unknown rule {args.id!r}; the rules are: "
                     f"{', '.join(rules.RULES)}")
    print(rules.RULES[args.id].documentation)
    return 0


def _check_settings(args: argparse.Namespace,
                    parser: argparse.ArgumentParser) -> argparse.Namespace:
    """`args` with pyproject.toml's settings where the command line gave
    none, checked; usage errors exit with status 2."""
    from tf_lso_migration import check

    if args.write and not args.fix:
        parser.error("--write needs --fix")
    if args.fix:
        if args.format not in (None, "text"):
            parser.error(f"--format {_NO_MEANING_WITH_FIX}")
        if args.fail_on is not None:
            parser.error(f"--fail-on {_NO_MEANING_WITH_FIX}")
    try:
        config = config_lib.load(
            pathlib.Path(args.config) if args.config else None)
        settings = config.settings
        select = settings.get("select", ())
        ignore = settings.get("ignore", ())
        if args.select is not None:
            select = report.rule_ids(args.select)
        if args.ignore is not None:
            ignore = report.rule_ids(args.ignore)
    except (config_lib.ConfigError, ValueError) as e:
        parser.error(str(e))
    for path in args.paths:
        if not os.path.exists(path):
            parser.error(f"no such file or directory: {path!r}")
    args.options = check.Options(
        select, ignore, args.route or settings.get("route", rules.ROUTES[0]))
    args.format = args.format or "text"
    args.fail_on = args.fail_on or settings.get("fail_on", "error")
    if args.exclude is not None:
        args.exclude, args.root = _ids(args.exclude), pathlib.Path.cwd()
    else:
        args.exclude, args.root = settings.get("exclude", ()), config.root
    return args


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _check(args: argparse.Namespace, prog: str) -> int:
    from tf_lso_migration import check

    notices: list[str] = []
    files = list(check.python_files(args.paths, args.exclude, args.root,
                                    notices))
    for notice in notices:
        print(notice, file=sys.stderr)
    if not files:
        print("warning: no Python files or notebooks found", file=sys.stderr)
    if args.fix:
        return _fix(args, files)
    progress = _is_terminal(sys.stderr)
    findings: list[check.Finding] = []
    for index, path in enumerate(files, 1):
        if progress:  # A long run on a terminal says how far it is.
            sys.stderr.write(f"\r\x1b[Kchecking {index}/{len(files)} files")
            sys.stderr.flush()
        found = check.check_file(path, args.options)
        findings.extend(found)
        if args.format == "text" and found:  # As each file is checked.
            if progress:
                sys.stderr.write("\r\x1b[K")
            print("\n".join(map(report.line, found)), flush=True)
    if progress:
        sys.stderr.write("\r\x1b[K")
    if args.format == "text":
        print(report.summary(findings, len(files), prog))
    else:
        write = {"json": report.json_report, "sarif": report.sarif}
        print(write[args.format](findings, len(files)))
    return 1 if report.fails(findings, args.fail_on) else 0


def _fix(args: argparse.Namespace, files: list[pathlib.Path]) -> int:
    from tf_lso_migration import fix

    try:
        diff, changed, skipped = fix.fix_files(
            files, write=args.write, options=args.options)
    except ImportError as e:
        print(e, file=sys.stderr)
        return 2
    sys.stdout.write(diff)
    for skip in skipped:
        print(report.line(skip.finding) if skip.finding
              else f"{skip.path}: skipped: {skip.reason}", file=sys.stderr)
    verb = "rewrote" if args.write else "would rewrite"
    hint = "" if args.write or not changed else " (apply with --write)"
    print(f"{verb} {len(changed)} file(s){hint}", file=sys.stderr)
    return 1 if any(skip.failed for skip in skipped) else 0


def console_main() -> NoReturn:
    """The `tf-lso` console script: `tf-lso check ...`, `tf-lso run ...`.

    Runs without importing tf_lso (and so TensorFlow) unless the command
    is `run`.
    """
    sys.exit(main(prog="tf-lso"))


if __name__ == "__main__":
    sys.exit(main())
