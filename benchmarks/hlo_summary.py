"""What tf_lso adds to the XLA-compiled step: op counts of the optimized HLO.

    .venv/bin/python benchmarks/hlo_summary.py [--shapes SHAPE ...]
        [--dump DIRECTORY] [--output PATH]

Compiles one training step per variant of `step_time.py` with
`jit_compile=True` and counts, in XLA's optimized HLO, the instructions of
each kind that run on a finite step: those of the entry computation and of
the computations it calls through `conditional` (the branch that applies;
fused computations are counted as their `fusion`, not by their contents).
`--dump` also writes each variant's HLO text there, for reading. It prints
the table; `--output docs/performance.md` also writes it there, between the
`hlo` markers.
"""

import argparse
import collections
import os
import re
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import step_time  # noqa: E402

VARIANTS = ("keras", "floor", "keras_lso", "tf_lso_keras", "tf_lso_legacy")
KINDS = ("fusion", "dot", "copy", "conditional", "concatenate", "slice",
         "reduce", "select")


def _opcode(line):
    """The opcode of an HLO instruction line, or None."""
    if " = " not in line:
        return None
    rhs = line.split(" = ", 1)[1]
    if rhs.startswith("("):  # A tuple type: skip to its closing parenthesis.
        rest = _after_group(rhs).lstrip()
    else:
        rest = rhs.split(" ", 1)[1] if " " in rhs else ""
    match = re.match(r"([\w-]+)\(", rest)
    return match.group(1) if match else None


def _after_group(text):
    """`text` after the parenthesis that closes its first character's."""
    depth = 0
    for index, char in enumerate(text):
        depth += (char == "(") - (char == ")")
        if depth == 0:
            return text[index + 1:]
    return ""


def computations(hlo):
    """{computation name: Counter of opcodes}, and the entry's name."""
    counts, entry, current = {}, None, None
    for line in hlo.splitlines():
        header = re.match(r"^(ENTRY )?(%?[\w.-]+) .*\{$", line)
        if header:
            current = header.group(2)
            if header.group(1):
                entry = current
            counts[current] = collections.Counter()
        elif current is not None and (opcode := _opcode(line)):
            counts[current][opcode] += 1
    return counts, entry


def finite_path(hlo):
    """Opcode counts of the entry and of each conditional's applying branch.

    The applying branch is the one with more fusions (the skip branch only
    counts a step); with no conditional, the entry alone.
    """
    counts, entry = computations(hlo)
    total = collections.Counter(counts[entry])
    for line in hlo.splitlines():
        if _opcode(line) != "conditional":
            continue
        branches = re.findall(r"(?:branch_computations=\{|true_computation=|"
                              r"false_computation=)([^},]+(?:, %[^},]+)*)",
                              line)
        names = [n.strip() for group in branches for n in group.split(",")]
        names = [n for n in names if n in counts]
        if names:
            total += max((counts[n] for n in names),
                         key=lambda c: c["fusion"])
    return total


def compile_step(variant, shape):
    """The optimized HLO of one jit-compiled step of `variant` on `shape`."""
    init, loss_fn = step_time.SHAPES[shape]()
    fn, _ = step_time._make(variant, init, loss_fn, jit_compile=True)
    return fn.experimental_get_compiler_ir()(stage="optimized_hlo")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="*",
                        default=["MLP 100 layers x 32 (200 vars)",
                                 "Keras Dense 100 layers x 32 (200 vars)",
                                 "10 independent vars"])
    parser.add_argument("--dump")
    parser.add_argument("--output",
                        help="also write the table into this page "
                        "(docs/performance.md)")
    args = parser.parse_args()
    lines = ["| shape | variant | " + " | ".join(KINDS) + " |",
             "|---|---|" + "---|" * len(KINDS)]
    for shape in args.shapes:
        for variant in VARIANTS:
            hlo = compile_step(variant, shape)
            if args.dump:
                os.makedirs(args.dump, exist_ok=True)
                name = re.sub(r"\W+", "_", f"{shape}_{variant}")
                with open(os.path.join(args.dump, f"{name}.txt"), "w") as f:
                    f.write(hlo)
            counts = finite_path(hlo)
            lines.append(f"| {shape} | {variant} | "
                         + " | ".join(str(counts[k]) for k in KINDS) + " |")
            print(lines[-1], flush=True)
    if args.output:
        step_time.write_block(args.output, "hlo", "\n".join(lines))


if __name__ == "__main__":
    main()
