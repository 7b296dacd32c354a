#!/usr/bin/env python3
"""Lists the functions longer than a limit in Rust and Python sources.

A function's length is its lines from the line of `fn` (Rust) or `def` (Python) to the line that
ends it, both counted: in Rust the brace that closes its body (found by matching braces outside
comments, strings, raw strings and character literals), in Python the last line of its body (as Python's
own parser, `ast`, says). A function inside another is listed on its own as well and still counts in
the outer one's lines. Closures are part of the function that holds them.

Usage: scripts/long-functions.py [--over N] [--all] [--except FILE:NAME]... PATH...
  PATH a file or a folder (searched for *.rs and *.py; target/ and hidden folders skipped)
  --over N  list only the functions longer than N lines (default 150)
  --all     list every function, longest first
  --except FILE:NAME  a function that may be longer (the pickle VM's one loop, for example)
Exits 1 when a function is over the limit (so CI can call it), 0 otherwise.
"""

import ast
import os
import re
import sys

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def rust_code(text):
    """The text with comments, strings and character literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)

    def blank(s):
        return "".join("\n" if c == "\n" else " " for c in s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(text[i:j]))
            i = j
        elif (c in "rb") and not (i and (text[i - 1].isalnum() or text[i - 1] == "_")) and (
            m := re.compile(r"(?:br|r)(#*)\"").match(text, i)
        ):
            end = '"' + m.group(1)
            j = text.find(end, m.end())
            j = n if j < 0 else j + len(end)
            out.append(blank(text[i:j]))
            i = j
        elif c == '"' or (c == "b" and text.startswith('b"', i) and not (i and IDENT.match(text[i - 1]))):
            j = i + (2 if c == "b" else 1)
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(blank(text[i : j + 1]))
            i = j + 1
        elif c == "'":
            # A character literal ('x', '\n', '\u{1F600}') or a lifetime ('a, 'static).
            if i + 1 < n and text[i + 1] == "\\":
                j = text.find("'", i + 2)
                j = n if j < 0 else j + 1
                out.append(blank(text[i:j]))
                i = j
            elif i + 2 < n and text[i + 2] == "'":
                out.append("   ")
                i += 3
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


FN = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")


def rust_functions(text):
    """(name, first line, length) of every Rust function with a body."""
    code = rust_code(text)
    line_at = [0] * (len(code) + 1)
    line = 1
    for k, ch in enumerate(code):
        line_at[k] = line
        if ch == "\n":
            line += 1
    line_at[len(code)] = line
    found = []
    for m in FN.finditer(code):
        j, depth = m.end(), 0
        while j < len(code):
            ch = code[j]
            if ch in "([":
                depth += 1
            elif ch in ")]":
                depth -= 1
            elif depth == 0 and ch in "{;":
                break
            j += 1
        if j >= len(code) or code[j] == ";":
            continue  # a declaration without a body
        braces, k = 0, j
        while k < len(code):
            if code[k] == "{":
                braces += 1
            elif code[k] == "}":
                braces -= 1
                if braces == 0:
                    break
            k += 1
        first, last = line_at[m.start()], line_at[min(k, len(code))]
        found.append((m.group(1), first, last - first + 1))
    return found


def python_functions(text):
    """(name, first line, length) of every Python function, from Python's own parser."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append((node.name, node.lineno, node.end_lineno - node.lineno + 1))
    return found


def sources(paths):
    for path in paths:
        if os.path.isfile(path):
            yield path
            continue
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d != "target" and not d.startswith("."))
            for f in sorted(files):
                if f.endswith((".rs", ".py")):
                    yield os.path.join(root, f)


def main(argv):
    over, every, paths, allowed = 150, False, [], set()
    it = iter(argv)
    for a in it:
        if a == "--over":
            over = int(next(it))
        elif a == "--except":
            allowed.add(next(it))
        elif a == "--all":
            every = True
        elif a.startswith("-"):
            sys.exit(__doc__)
        else:
            paths.append(a)
    if not paths:
        sys.exit(__doc__)
    rows = []
    for path in sources(paths):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        fns = rust_functions(text) if path.endswith(".rs") else python_functions(text)
        rows += [(length, path, first, name) for name, first, length in fns]
    rows.sort(key=lambda r: (-r[0], r[1], r[2]))
    long = [r for r in rows if r[0] > over and f"{r[1]}:{r[3]}" not in allowed]
    for length, path, first, name in rows if every else long:
        print(f"{length:5d}  {path}:{first}  {name}")
    if not every:
        print(f"{len(long)} of {len(rows)} functions over {over} lines")
    return 1 if long else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BrokenPipeError:  # a reader such as `head` stopped reading
        sys.exit(0)
