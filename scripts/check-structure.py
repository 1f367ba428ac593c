#!/usr/bin/env python3
"""The structure check: the imports of `src/` against the layers of ARCHITECTURE.md.

Reads the layer table of ARCHITECTURE.md ("## Layers": one row per layer, top first, its
modules in backticks: `replica.rs`, `cli/`, ...), then every `.rs` file under `src/`, and
resolves each path it names through `crate::` (and `super::`, `self::`) to the file that
defines the module it reaches. It fails, listing what it found, when

  - a file imports a module of a layer above its own (an upward import),
  - the files import each other in a circle (inside a folder too: `sysdb/mod.rs` and
    `sysdb/sqlite/mod.rs` may not import each other),
  - a top-level module of `src/` is in no layer, or a layer names a module that does
    not exist,
  - a file outside `src/kafka/` names `rdkafka` (the Kafka client stays behind one door).

It prints one summary line: files, modules, imports (distinct file -> file arrows),
circles, upward imports. Comments and string literals are ignored; a `use` of a
re-export counts as an import of the file that re-exports.

    scripts/check-structure.py [--root DIR]      # exit 0 when clean, 1 otherwise
"""
import argparse
import os
import re
import sys


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def read_layers(architecture):
    """[(layer name, [module names])], top first, from the '## Layers' table."""
    text = read(architecture)
    m = re.search(r"^## Layers\n(.*?)(?=^## )", text, re.S | re.M)
    if not m:
        raise SystemExit(f"{architecture}: no '## Layers' section")
    layers = []
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[0] in ("layer", "---") or set(cells[0]) <= {"-"}:
            continue
        modules = []
        # Module names only: what a row says of them in parentheses is not a module.
        for name in re.findall(r"`([^`]+)`", re.sub(r"\([^)]*\)", "", cells[1])):
            name = name.rstrip("/")
            if name.endswith(".rs"):
                name = name[:-3]
            modules.append(name)
        layers.append((cells[0], modules))
    if not layers:
        raise SystemExit(f"{architecture}: the layer table is empty")
    return layers


def strip_comments_and_strings(src):
    """The source with comments, string and char literals blanked (line numbers kept)."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
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
            out.append("\n" * src.count("\n", i, j))
            i = j
        elif c == "r" and re.match(r'r#*"', src[i:i + 10]) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', src[i:]).group(1)
            end = src.find('"' + hashes, i + 2 + len(hashes))
            end = n if end < 0 else end + 1 + len(hashes)
            out.append('""' + "\n" * src.count("\n", i, end))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append('""' + "\n" * src.count("\n", i, j))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", src[i:i + 12]):
            j = src.find("'", i + 2 if src[i + 1] == "\\" else i + 1)
            out.append("' '")
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


class Tree:
    """The module tree of one crate: module path (tuple) -> file."""

    def __init__(self, src_dir):
        self.src = src_dir
        self.files = {}  # module path -> relative file
        for dirpath, _, names in os.walk(src_dir):
            for name in names:
                if not name.endswith(".rs"):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), src_dir)
                parts = rel[:-3].split(os.sep)
                if parts[-1] == "mod" or rel in ("lib.rs", "main.rs"):
                    parts = parts[:-1] if parts[-1] == "mod" else []
                key = tuple(parts)
                # main.rs and lib.rs are both the root: keep lib.rs as the crate's root.
                if key in self.files and rel == "main.rs":
                    continue
                self.files[key] = rel
        self.module_of_file = {}
        for k, v in self.files.items():
            self.module_of_file[v] = k
        if "main.rs" not in self.module_of_file:
            if os.path.exists(os.path.join(src_dir, "main.rs")):
                self.module_of_file["main.rs"] = ("main",)

    def resolve(self, module, segments):
        """The file reached by the path `segments` from `module` (crate-relative)."""
        target = list(module)
        segs = list(segments)
        # A path that starts with a child module's name is relative to this module.
        while segs and segs[0] in ("super", "self", "crate"):
            s = segs.pop(0)
            if s == "crate":
                target = []
            elif s == "super":
                target = target[:-1]
        best = tuple(target)
        for s in segs:
            nxt = best + (s,)
            if nxt in self.files:
                best = nxt
            else:
                break
        return self.files.get(best)


USE_RE = re.compile(r"\buse\s+([A-Za-z_][^;]*);", re.S)
MOD_RE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;", re.M)


REEXPORT_RE = re.compile(r"\bpub(?:\([^)]*\))?\s+use\s+[^;]*;", re.S)


TEST_MOD_RE = re.compile(r"#\[cfg\((?:test|any\(test[^)]*\))\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*(;|\{)")


def without_test_modules(code):
    """The code without its inline test modules (`#[cfg(test)] mod tests { ... }`): test
    code is not part of the structure."""
    out, pos = [], 0
    for m in TEST_MOD_RE.finditer(code):
        if m.group(2) != "{" or m.start() < pos:
            continue
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        out.append(code[pos:m.start()])
        out.append("\n" * code.count("\n", m.start(), j))
        pos = j
    out.append(code[pos:])
    return "".join(out)


def test_children(code):
    """Child modules a file declares for tests only (`#[cfg(test)] mod x;`)."""
    return {m.group(1) for m in TEST_MOD_RE.finditer(code) if m.group(2) == ";"}


def paths_in(code):
    """Every path a file names that can reach a module of this crate: those through
    `crate::`, `super::`, `self::` or a child module the file declares (`mod x;` then
    `x::...`), in plain code and as each leaf of a `use` tree. A re-export (`pub use`)
    is the module's face, not a use of what it names: it is not counted."""
    children = set(MOD_RE.findall(code))
    code = REEXPORT_RE.sub(";", code)
    starts = ["crate", "super", "self"] + sorted(children)
    path_re = re.compile(r"(?<![A-Za-z0-9_:])((?:" + "|".join(starts) + r")(?:::[A-Za-z_][A-Za-z0-9_]*)+)")
    found = set()
    for m in USE_RE.finditer(code):
        for p in expand_use(re.sub(r"\s+", "", m.group(1))):
            if p.split("::")[0] in starts:
                found.add(p)
    for m in path_re.finditer(code):
        found.add(m.group(1))
    return found


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e'] (renames and globs dropped)."""
    i = tree.find("{")
    if i < 0:
        return [tree.split(" as ")[0].rstrip(":*").rstrip(":")]
    prefix, inner = tree[:i], tree[i + 1:-1]
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
        if not p:
            continue
        if p == "self":
            out.append(prefix.rstrip(":"))
        else:
            out.extend(expand_use(prefix + p))
    return out


def find_circles(edges):
    """Strongly connected components of more than one file (Tarjan), each sorted."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    nodes = set(edges) | {b for bs in edges.values() for b in bs}

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
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
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def check(root):
    layers = read_layers(os.path.join(root, "ARCHITECTURE.md"))
    src = os.path.join(root, "src")
    tree = Tree(src)
    layer_of = {}
    problems = []
    for rank, (name, modules) in enumerate(layers):
        for m in modules:
            layer_of[m] = (rank, name)
    top_modules = {k[0] for k in tree.files if k} | {"main"}
    for m in sorted(top_modules - set(layer_of)):
        problems.append(f"src/{m}: a module in no layer of ARCHITECTURE.md")
    externals = {m for m in layer_of if m not in top_modules}
    known_external = {"record"}
    for m in sorted(externals - known_external):
        # A layer may name a crate the library re-exports (lib.rs `pub use ... as m`).
        lib = read(os.path.join(src, "lib.rs"))
        reexported = re.search(rf"\bas\s+{re.escape(m)}\s*;", lib) or any(
            m in [x.strip() for x in group.split(",")] for group in re.findall(r"pub use \w+::\{([^}]*)\}", lib)
        )
        if not reexported:
            problems.append(f"ARCHITECTURE.md names a module {m!r} that src/ does not have")

    def layer_of_file(rel):
        module = tree.module_of_file.get(rel, ())
        top = module[0] if module else ("main" if rel == "main.rs" else None)
        return top, layer_of.get(top)

    # Files that only tests compile (declared `#[cfg(test)] mod x;`, and what is below).
    test_only = set()
    for rel, module in tree.module_of_file.items():
        code = strip_comments_and_strings(read(os.path.join(src, rel)))
        base = () if rel in ("main.rs", "lib.rs") else module
        for child in test_children(code):
            for key, f in tree.files.items():
                if key[: len(base) + 1] == base + (child,):
                    test_only.add(f)
    edges = {}
    upward = []
    for rel in sorted(tree.module_of_file):
        if rel in test_only:
            continue
        code = without_test_modules(strip_comments_and_strings(read(os.path.join(src, rel))))
        if re.search(r"\brdkafka\b", code) and not rel.startswith("kafka" + os.sep):
            problems.append(f"src/{rel}: names rdkafka outside src/kafka/")
        module = tree.module_of_file[rel]
        if rel == "main.rs":
            module = ()
        top, here = layer_of_file(rel)
        for path in paths_in(code):
            target = tree.resolve(module, path.split("::"))
            if target is None or target == rel or target == "lib.rs" or target in test_only:
                continue
            edges.setdefault(rel, set()).add(target)
            ttop, there = layer_of_file(target)
            if here and there and there[0] < here[0] and ttop != top:
                upward.append(f"src/{rel} ({here[1]}) imports src/{target} ({there[1]}) above it: {path}")
    circles = find_circles(edges)
    for c in circles:
        problems.append("an import circle: " + " <-> ".join("src/" + f for f in c))
    problems.extend(sorted(set(upward)))
    arrows = sum(len(v) for v in edges.values())
    summary = (
        f"structure: {len(tree.module_of_file)} files, {len(top_modules)} modules, {arrows} imports, "
        f"{len(circles)} circles, {len(set(upward))} upward imports"
    )
    return summary, problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    args = ap.parse_args()
    summary, problems = check(os.path.abspath(args.root))
    print(summary)
    for p in problems:
        print("  " + p)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
