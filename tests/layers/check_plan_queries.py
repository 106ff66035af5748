#!/usr/bin/env python3
"""The engine never asks which step plan it holds (docs/design.md, "Step plans").

Every header of include/zero/engine outside step/ (where the plans live) and the optimizers themselves is read for
a question about the placement of the optimizer state: a call of the step plan's (or the old optimizer_step's)
nvme(), host(), partial(), host_part(), device(), host_grads() or offloaded(), or a variant test on it
(holds_alternative, get_if). Each is reported as FILE:LINE with the line; the exit status is 1 when any is found.

    check_plan_queries.py --root REPO [--dir include/zero/engine]
"""
import argparse
import pathlib
import re
import sys

# Members and expressions that hold the plan in the engine's code.
HOLDER = r"(?:plan_|optimizer_|optimizer\(\))"
ASK = re.compile(HOLDER + r"\s*(?:\.|->)\s*(nvme|host|partial|host_part|device|host_grads|offloaded)\s*\(")
VARIANT = re.compile(r"(?:holds_alternative|get_if)\s*<[^>]*>\s*\(\s*&?\s*" + HOLDER)
# Where placement is the subject: the plans and the optimizers they own.
EXEMPT_DIRS = {"step"}
EXEMPT_FILES = {"partitioned_adamw.hpp", "offloaded_adamw.hpp", "partial_adamw.hpp", "nvme_adamw.hpp"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True, type=pathlib.Path)
    parser.add_argument("--dir", default="include/zero/engine")
    args = parser.parse_args()
    base = args.root / args.dir
    headers = sorted(p for p in base.rglob("*.hpp")
                     if p.name not in EXEMPT_FILES and not EXEMPT_DIRS & set(p.relative_to(base).parts[:-1]))
    if not headers:
        print(f"check_plan_queries: no headers under {base}")
        return 1
    found = 0
    for path in headers:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("//", 1)[0]
            if ASK.search(code) or VARIANT.search(code):
                print(f"{path.relative_to(args.root)}:{number}: asks which step plan it holds: {line.strip()}")
                found += 1
    print(f"{len(headers)} headers read, {found} question(s) about the plan")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
