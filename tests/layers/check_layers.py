#!/usr/bin/env python3
"""Holds zero's code to the layer table of docs/design.md.

check_layers.py [--root DIR] includes
    Reads the table under "## Layers, bottom up" (columns: layer, where, depends on) and every
    `#include "zero/..."` (or <zero/...>) line in the places its "where" column lists. Fails, naming
    file:line and both layers, on an include of a layer above the file's own (up the order) or of a
    layer the row does not name under "depends on", directly or through the rows it names (beside
    it). Also fails when an entry of include/zero has no row, or the table names what is not there.
    A forwarding header (docs/api.md: a moved public header's old path, kept for a release) may include
    its new path whatever the layers: a file with exactly one zero include whose `#pragma message`
    reads "zero: <its own path> is deprecated: include <that include>".

check_layers.py [--root DIR] header_length --max-lines N [--allow-long PATH ...]
    Fails on a header under include/zero longer than N lines, unless it is allowed; an allowed
    header that is no longer too long (or is gone) fails too, so the list only shrinks.

Exit status: 0 when everything holds, 1 when something breaks the rules, 2 for a malformed table.
"""

import argparse
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](zero/[^>"]+)[>"]')
FORWARD = re.compile(r'^\s*#\s*pragma\s+message\s*\(\s*"zero: <(zero/[^>]+)> is deprecated: include <(zero/[^>]+)>', re.M)
SOURCES = (".hpp", ".h", ".cuh", ".cu", ".cpp")
NONE = {"", "-", "—", "none"}


class TableError(Exception):
    pass


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def names(cell):
    """`a`, `b/c` -> ["a", "b/c"]; backticks and surrounding blanks are dropped."""
    out = [n.strip().strip("`").strip().rstrip("/") for n in cell.split(",")]
    return [n for n in out if n not in NONE]


def read_table(design):
    """Returns the rows bottom up: [(layer, [where...], [depends...], line)]."""
    with open(design, encoding="utf-8") as f:
        lines = f.read().split("\n")
    try:
        start = next(i for i, l in enumerate(lines) if l.strip() == "## Layers, bottom up")
    except StopIteration:
        raise TableError(f"{design}: no section '## Layers, bottom up'")
    header = None
    rows = []
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if line.startswith("## "):
            break
        if not line.lstrip().startswith("|"):
            if rows:
                break
            continue
        row = cells(line)
        if header is None:
            header = [h.lower() for h in row]
            continue
        if all(set(c) <= set("-: ") for c in row):
            continue  # the |---|---| line
        if len(row) != len(header):
            raise TableError(f"{design}:{i + 1}: {len(row)} cells where the header has {len(header)}")
        rows.append((row, i + 1))
    if header is None or not rows:
        raise TableError(f"{design}: no layer table under '## Layers, bottom up'")
    for column in ("layer", "where", "depends on"):
        if column not in header:
            raise TableError(f"{design}: the layer table has no column '{column}' (it has {', '.join(header)})")
    col = {name: header.index(name) for name in ("layer", "where", "depends on")}
    return [(r[col["layer"]].strip("`"), names(r[col["where"]]), names(r[col["depends on"]]), n) for r, n in rows]


def check_table(root, design_rel, table, errors):
    order = {}
    for layer, where, deps, line in table:
        if layer in order:
            errors.append(f"{design_rel}:{line}: layer {layer} has a second row")
        for d in deps:
            if d not in order:
                below = "not a layer of the table" if d not in {t[0] for t in table} else "not below it"
                errors.append(f"{design_rel}:{line}: layer {layer} depends on {d}, which is {below}")
        home = f"include/zero/{layer}"
        if home not in where:
            errors.append(f"{design_rel}:{line}: layer {layer} does not list {home} under 'where'")
        for w in where:
            if not os.path.exists(os.path.join(root, w)):
                errors.append(f"{design_rel}:{line}: layer {layer} lists {w}, which does not exist")
        order[layer] = len(order)
    top = os.path.join(root, "include", "zero")
    for entry in sorted(os.listdir(top)):
        if entry not in order:
            errors.append(f"include/zero/{entry}: no row in the layer table of {design_rel}")
    allowed = {}
    for layer, _, deps, _ in table:
        reach = {layer}
        for d in deps:
            reach |= allowed.get(d, {d})
        allowed[layer] = reach
    return order, allowed


def files_of(root, where):
    path = os.path.join(root, where)
    if os.path.isfile(path):
        yield where
        return
    for folder, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(SOURCES):
                yield os.path.relpath(os.path.join(folder, name), root)


def layer_of(target):
    """zero/comm/detail/x.hpp -> comm; zero/zero.hpp -> zero.hpp."""
    parts = target.split("/")
    return parts[1]


def report(errors, failed, passed):
    """Prints each error and `failed` with their count, or `passed`; returns the exit status."""
    for e in errors:
        print(e)
    if errors:
        print(failed.format(len(errors)))
        return 1
    print(passed)
    return 0


def check_includes(root, design_rel, table):
    errors = []
    order, allowed = check_table(root, design_rel, table, errors)
    deps_of = {layer: deps for layer, _, deps, _ in table}
    includes = 0
    seen = set()
    for layer, where, _, _ in table:
        for w in where:
            if not os.path.exists(os.path.join(root, w)):
                continue
            for rel in files_of(root, w):
                if rel in seen:
                    continue
                seen.add(rel)
                with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
                    text = f.read()
                targets = [m.group(1) for m in map(INCLUDE.match, text.splitlines()) if m]
                forward = FORWARD.search(text)
                forwards_to = None
                if forward and len(targets) == 1 and rel == "include/" + forward.group(1):
                    forwards_to = forward.group(2)
                for number, line in enumerate(text.splitlines(), 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    includes += 1
                    target = m.group(1)
                    other = layer_of(target)
                    if other in allowed[layer] or target == forwards_to:
                        continue
                    said = ", ".join(deps_of[layer]) or "nothing"
                    if other not in order:
                        why = "which is in no layer of the table"
                    elif order[other] > order[layer]:
                        why = "which is above it: includes point down only"
                    else:
                        why = "which its row does not name under 'depends on'"
                    errors.append(f'{rel}:{number}: layer {layer} includes "{target}" of layer {other}, {why} '
                                  f"({design_rel}: {layer} depends on {said})")
    return report(errors, f"layers: {{}} problem(s) with the layer order of {design_rel}",
                  f"layers: {includes} includes in {len(seen)} files follow the {len(table)} layers of {design_rel}")


def check_lengths(root, max_lines, allowed):
    errors = []
    allowed = set(allowed)
    top = os.path.join(root, "include", "zero")
    for rel in files_of(root, os.path.relpath(top, root)):
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            count = sum(1 for _ in f)
        if rel in allowed:
            allowed.discard(rel)
            if count <= max_lines:
                errors.append(f"{rel}: {count} lines, within {max_lines} now: take it off the allowed list")
        elif count > max_lines:
            errors.append(f"{rel}: {count} lines, more than {max_lines}: split it")
    for rel in sorted(allowed):
        errors.append(f"{rel}: on the allowed list but not a header under include/zero")
    return report(errors, "header_length: {} problem(s)",
                  f"header_length: every header under include/zero has at most {max_lines} lines")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.normpath(os.path.join(here, "..", "..")))
    parser.add_argument("check", choices=["includes", "header_length"])
    parser.add_argument("--max-lines", type=int, default=600)
    parser.add_argument("--allow-long", action="append", default=[])
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    if args.check == "header_length":
        return check_lengths(root, args.max_lines, args.allow_long)
    design_rel = "docs/design.md"
    try:
        table = read_table(os.path.join(root, design_rel))
    except (OSError, TableError) as e:
        print(f"layers: {e}")
        return 2
    return check_includes(root, design_rel, table)


if __name__ == "__main__":
    sys.exit(main())
