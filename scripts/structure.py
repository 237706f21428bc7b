#!/usr/bin/env python3
"""Checks the shape of the source tree (issue 13's rules), in every crate's src/:

  * no file over MAX_FILE_LINES lines,
  * no function over MAX_FN_LINES lines (test code excluded),
  * no import circle between files of one crate, except those listed in
    ALLOWED_CIRCLES (each must say why in the code),
  * no ring-field atomics, fences or futex calls outside crates/proto (the
    ring protocols live in proto's producer/consumer types).

  scripts/structure.py            report, exit 1 on any violation
  scripts/structure.py --graph    also print each crate's file import graph

An "import" is any path in non-test code that names another file's module:
`use crate::a::b`, `crate::a::b::f()`, `super::x`, or a name brought in by a
`use` or `mod` of the file. A parent declaring `mod child;` is not an import.
"""
import os
import re
import sys

MAX_FILE_LINES = 800
MAX_FN_LINES = 100
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
# Circles allowed, as sorted tuples of module paths, with the file that says why.
ALLOWED_CIRCLES = {}
# Files outside proto that may touch ring atomics: none.
RING_FIELDS = (
    "paused|host_waiting|kicks_seen|error_seq|misuse|bytes_done|end_errno"
)


def strip_comments_and_strings(src):
    """Blanks comments, string and char literals (keeping newlines), so brace
    counting and path matching see only code."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', src[i:i + 10]) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'r(#*)"', src[i:])
            end = '"' + m.group(1)
            j = src.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            j += 1
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif c == "'":
            m = re.match(r"'(\\.[^']*|[^\\'])'", src[i:])
            if m:
                out.append(" " * len(m.group(0)))
                i += len(m.group(0))
            else:  # a lifetime
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def block_end(code, open_idx):
    depth = 0
    for j in range(open_idx, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(code) - 1


def blank_tests(code):
    """Blanks `#[cfg(test)]` items (test modules and test-only functions)."""
    while True:
        m = re.search(r"#\[cfg\((all\()?test\b[^\]]*\]", code)
        if not m:
            return code
        k = m.end()
        # The item ends at its block's close, or at `;` for `mod x;`/`use`.
        semi = code.find(";", k)
        brace = code.find("{", k)
        if brace < 0 or (0 <= semi < brace):
            end = semi
        else:
            end = block_end(code, brace)
        code = code[:m.start()] + re.sub(r"[^\n]", " ", code[m.start():end + 1]) + code[end + 1:]


def crate_files(crate_dir):
    src = os.path.join(crate_dir, "src")
    for dirpath, _, files in os.walk(src):
        for f in files:
            if f.endswith(".rs"):
                yield os.path.join(dirpath, f)


def module_path(src_dir, path):
    rel = os.path.relpath(path, src_dir)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> ["a::b", "a::c::d", "a::c::e"]."""
    tree = re.sub(r"\s+", "", tree)
    i = tree.find("{")
    if i < 0:
        return [tree]
    prefix, inner = tree[:i], tree[i + 1:block_end(tree, i)]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        if p:
            out.extend(prefix + e for e in expand_use(p))
    return out


def resolve(modules, here, segs, aliases, children):
    """Maps a path (list of segments) to the deepest module file it names."""
    if not segs:
        return None
    head = segs[0]
    if head == "crate":
        base, rest = (), segs[1:]
    elif head == "super":
        base, rest = here[:-1] if here else (), segs[1:]
        while rest and rest[0] == "super":
            base, rest = base[:-1], rest[1:]
    elif head == "self":
        base, rest = here, segs[1:]
    elif head in aliases:
        base, rest = aliases[head], segs[1:]
    elif head in children:
        base, rest = here + (head,), segs[1:]
    else:
        return None
    best = base if base in modules else None
    cur = base
    for s in rest:
        cur = cur + (s,)
        if cur in modules:
            best = cur
        else:
            break
    return best


def graph_of(crate_dir):
    src_dir = os.path.join(crate_dir, "src")
    codes = {}
    for f in crate_files(crate_dir):
        with open(f) as fh:
            codes[module_path(src_dir, f)] = (f, blank_tests(strip_comments_and_strings(fh.read())))
    modules = set(codes)
    edges = {m: set() for m in modules}
    for here, (_, code) in codes.items():
        children = set(re.findall(r"\bmod\s+(\w+)\s*;", code))
        aliases = {}
        uses = []
        for m in re.finditer(r"\buse\s+([^;]+);", code):
            for p in expand_use(m.group(1)):
                p = re.sub(r"::\*$", "", p)
                name = p.split("as")[-1] if "as" in p.split("::")[-1] else None
                segs = [s for s in re.split(r"::", re.sub(r"\bas\b.*$", "", p)) if s]
                uses.append(segs)
                target = resolve(modules, here, segs, {}, children)
                if target is not None and target == resolve_exact(modules, here, segs, children):
                    aliases[(name or segs[-1]).strip()] = target
        for segs in uses:
            t = resolve(modules, here, segs, {}, children)
            if t is not None and t != here:
                edges[here].add(t)
        for m in re.finditer(r"\b((?:\w+::)+\w+)", code):
            segs = m.group(1).split("::")
            t = resolve(modules, here, segs, aliases, children)
            if t is not None and t != here:
                edges[here].add(t)
    # A parent's `mod child;` is not an import, but `pub use child::X` is.
    return codes, edges


def resolve_exact(modules, here, segs, children):
    t = resolve(modules, here, segs, {}, children)
    # exact: the whole path is the module (so the last name is a module alias)
    return t if t is not None and len(t) >= 1 and t[-1] == segs[-1] else None


def sccs(edges):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def long_functions(path, code):
    out = []
    for m in re.finditer(r"\bfn\s+(\w+)\s*(<[^{;]*?>)?\s*\(", code):
        brace = code.find("{", m.end())
        semi = code.find(";", m.end())
        if brace < 0 or (0 <= semi < brace and "{" not in code[m.end():semi]):
            continue  # a declaration without a body
        end = block_end(code, brace)
        lines = code.count("\n", m.start(), end) + 1
        if lines > MAX_FN_LINES:
            line = code.count("\n", 0, m.start()) + 1
            out.append((path, line, m.group(1), lines))
    return out


def name(mod):
    return "::".join(mod) or "(root)"


def main():
    show_graph = "--graph" in sys.argv
    bad = 0
    crates_dir = os.path.join(ROOT, "crates")
    for crate in sorted(os.listdir(crates_dir)):
        crate_dir = os.path.join(crates_dir, crate)
        if not os.path.isdir(os.path.join(crate_dir, "src")):
            continue
        codes, edges = graph_of(crate_dir)
        for mod, (path, code) in sorted(codes.items()):
            rel = os.path.relpath(path, ROOT)
            with open(path) as fh:
                n = sum(1 for _ in fh)
            if n > MAX_FILE_LINES:
                print(f"file too long: {rel}: {n} lines (max {MAX_FILE_LINES})")
                bad += 1
            for _, line, fname, lines in long_functions(rel, code):
                print(f"function too long: {rel}:{line}: fn {fname}: {lines} lines (max {MAX_FN_LINES})")
                bad += 1
            if crate != "proto":
                for i, l in enumerate(code.split("\n"), 1):
                    if re.search(r"\bfence\s*\(|\bfutex::\w+\s*\(|(\.(" + RING_FIELDS + r")|\bctl(\(\))?\.\w+)\s*\.\s*(load|store|fetch_\w+|swap|compare_exchange\w*)\b", l):
                        print(f"ring atomics outside proto: {rel}:{i}: {l.strip()}")
                        bad += 1
        for comp in sccs(edges):
            key = tuple(name(m) for m in comp)
            if key in ALLOWED_CIRCLES:
                continue
            print(f"import circle in {crate}: " + " <-> ".join(key))
            bad += 1
        if show_graph:
            print(f"# {crate}")
            for m in sorted(edges):
                print(f"  {name(m)} -> {', '.join(sorted(name(t) for t in edges[m]))}")
    print(f"structure: {bad} violation(s)" if bad else "structure: ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
