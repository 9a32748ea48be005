"""`python -m tf_lso run SCRIPT.py [args...]`: run an unmodified TF 2.x script.

Installs the legacy mixed-precision names (`tf_lso.install()`) and runs the
script as `__main__`, with `sys.argv` set to the script and its arguments.
"""

import argparse
import os
import runpy
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m tf_lso",
        description="Run TF 2.1-2.4 mixed-precision code on current "
        "TensorFlow, with the legacy names provided by tf_lso.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run", help="run a script with tf_lso.install() in effect"
    )
    run.add_argument("script", help="the Python script to run")
    run.add_argument("args", nargs=argparse.REMAINDER,
                     help="arguments passed on to the script")
    args = parser.parse_args(argv)

    import tf_lso

    tf_lso.install()
    sys.argv = [args.script] + args.args
    # As `python SCRIPT.py` would: the script's directory comes first.
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.script)))
    runpy.run_path(args.script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
