#!/usr/bin/env python3
"""The docs check: every path, invariant number and section number that the docs and the
code comments cite exists.

Reads the Markdown pages (README.md, ARCHITECTURE.md, BENCHMARKS.md, docs/**/*.md but not
docs/bench/history.md, a diary of past states whose paths have moved since, schemas/*.md,
deploy/**/*.md, bench/**/README.md) and the comments of the sources (`//`, `///`, `//!`
in the .rs files of src/, record/, base/, kafka/, integration-tests/, fuzz/, bench/; `#`
in scripts/**/*.sh, scripts/**/*.py, deploy/**/*.sh, .ci/run), and reports

  - a path that does not exist: one in backticks or a Markdown link that looks like a file
    or folder of this repository (it has a `/` and a known extension, or ends in `/`), or
    a path with a `/` and a known extension in plain text (a folder in plain text or a
    path in a code fence: only when it starts at a folder of the root, or follows a `cd`
    in the fence). It is looked for from the citing file's folder, the repository root,
    src/ and each crate's src/ (record/src, base/src, ...), so `sysdb/migrations.rs` in a
    comment is fine; a short path whose first folder is none of the root's (`tests/x.rs`,
    `sqlite/`) is fine too when it is the tail of a path of the tree;
  - a bare file name in backticks or a link (`commit.rs`) that no file of the repository
    has (for source and Markdown names only: a bare `sluice.toml` is the user's);
  - an invariant number (`invariant 3`, `invariants 6-9`, `invariants 1 and 11`) that is
    not in the numbered list of the "Invariants" section of docs/design.md (with
    "structural" or ARCHITECTURE.md before it: the "Structural invariants" list of
    ARCHITECTURE.md);
  - a section number (`docs/design.md section 7.2`, `§8`, `sections 1-3`) that is no
    `## N.` / `### N.M` heading of the file named (a bare one: of the citing page when it
    has numbered headings, otherwise of docs/design.md);
  - an ambiguous reference: `(item 2)`, a position in a numbered list the text does not
    name.

Not checked: URLs, absolute paths, git-ignored paths (target/, .local/, ...), globs,
placeholders (`<name>`, `{a,b}`, `$VAR`, `...`, a word such as PATH, FILE, DATE), and the
exceptions of scripts/check-docs.allow: one `file:pattern` a line (both shell patterns,
`#` comments), which silences the problems of that file whose cited text matches.

Prints one line per problem, `file:line: what is wrong (the cited text)`, then one summary
line: files, paths, invariant citations, problems.

    scripts/check-docs.py [--root DIR]      # exit 0 when clean, 1 otherwise
"""
import argparse
import fnmatch
import os
import re
import sys

DESIGN = "docs/design.md"
ARCHITECTURE = "ARCHITECTURE.md"
ALLOW = "scripts/check-docs.allow"
SKIPPED_PAGES = {"docs/bench/history.md"}
EXTENSIONS = (
    "rs", "md", "py", "sh", "toml", "json", "yaml", "yml", "avsc", "svg", "java", "sql",
    "xml", "tpl", "txt", "lock",
)
# Bare file names are checked for these only: a bare `sluice.toml` or `manifest.json` is
# mostly a file of the user's or of a run, not of the repository.
NAME_EXTENSIONS = ("rs", "md", "py", "sh", "java", "sql", "avsc")
PLACEHOLDER_WORDS = {
    "PATH", "FILE", "DIR", "NAME", "DATE", "COMMIT", "SHA", "VERSION", "NEW", "OLD", "X", "N",
    "ID", "FOO", "BAR", "XXX",
}
IGNORED_DIRS = {".git", "target", ".local", "node_modules", "__pycache__", ".venv"}
RUST_DIRS = ("src", "record", "base", "kafka", "integration-tests", "fuzz", "bench")


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


class Repo:
    """The files and folders of the tree (relative, `/`-separated), and the crates."""

    def __init__(self, root):
        self.root = root
        self.files, self.dirs, self.names = set(), {""}, {}
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_DIRS)
            rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
            rel_dir = "" if rel_dir == "." else rel_dir
            for d in dirnames:
                self.dirs.add(join(rel_dir, d))
            for name in filenames:
                rel = join(rel_dir, name)
                self.files.add(rel)
                self.names.setdefault(name, []).append(rel)
        # Where a short path may be rooted: the binary's src/, then each crate's src/.
        self.top = {d for d in self.dirs if d and "/" not in d}
        self.bases = ["", "src"] + sorted(d + "/src" for d in self.top if d + "/src" in self.dirs and d != "src")
        self.ignore = []  # (folder of the .gitignore, pattern, anchored)
        for rel in sorted(self.files):
            if rel == ".gitignore" or rel.endswith("/.gitignore"):
                where = rel.rsplit("/", 1)[0] if "/" in rel else ""
                for line in read(os.path.join(root, rel)).splitlines():
                    line = line.strip()
                    if line and not line.startswith(("#", "!")):
                        pat = line.rstrip("/")
                        self.ignore.append((where, pat.lstrip("/"), "/" in pat))

    def ignored(self, rel):
        """Whether `rel` (or a folder above it) is git-ignored: generated, not cited."""
        segs = rel.strip("/").split("/")
        for i in range(1, len(segs) + 1):
            prefix = "/".join(segs[:i])
            for where, pat, anchored in self.ignore:
                if where and not prefix.startswith(where + "/"):
                    continue
                inner = prefix[len(where) + 1:] if where else prefix
                if fnmatch.fnmatchcase(inner if anchored else segs[i - 1], pat):
                    return True
        return False

    def exists(self, rel):
        rel = normalize(rel)
        if rel is None:
            return False
        return rel.rstrip("/") in self.dirs if rel.endswith("/") else (rel in self.files or rel in self.dirs)

    def find(self, path, citing_dir, extra=()):
        """The first existing spelling of `path`: from the citing file's folder (and the
        folders in `extra`), the root, src/, then each crate's src/; a short path (its first
        folder is not one of the root's) also as the tail of any path of the tree."""
        for base in [citing_dir, *extra] + self.bases:
            rel = join(base, path)
            if self.exists(rel):
                return normalize(rel)
        first = path.split("/")[0]
        if first not in self.top and first not in (".", ".."):
            tail = "/" + path.rstrip("/")
            pool = self.dirs if path.endswith("/") else self.files | self.dirs
            for rel in sorted(pool):
                if rel.endswith(tail):
                    return rel
        return None


def join(a, b):
    return b if not a else a + "/" + b


def normalize(rel):
    """`a/./b/../c` -> `a/c`, keeping a trailing `/`; None when it climbs out of the root."""
    trailing = rel.endswith("/")
    out = []
    for seg in rel.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if not out:
                return None
            out.pop()
        else:
            out.append(seg)
    return "/".join(out) + ("/" if trailing and out else "")


# ---------------------------------------------------------------------------------------
# What is read: the pages, and the comments of the sources, as blocks of text with the
# line each block starts on.


def pages(repo):
    """The Markdown pages that are checked, sorted."""
    out = []
    for rel in repo.files:
        if not rel.endswith(".md") or rel in SKIPPED_PAGES:
            continue
        top = rel.split("/")[0]
        if "/" not in rel:
            ok = rel in ("README.md", "ARCHITECTURE.md", "BENCHMARKS.md")
        elif top in ("docs", "deploy"):
            ok = True
        elif top == "schemas":
            ok = rel.count("/") == 1
        elif top == "bench":
            ok = rel.endswith("/README.md")
        else:
            ok = False
        if ok:
            out.append(rel)
    return sorted(out)


def sources(repo):
    """The sources whose comments are checked, sorted: (file, comment syntax)."""
    out = []
    for rel in repo.files:
        top = rel.split("/")[0]
        if rel.endswith(".rs") and top in RUST_DIRS:
            out.append((rel, "//"))
        elif top == "scripts" and rel.endswith((".sh", ".py")):
            out.append((rel, "#"))
        elif top == "deploy" and rel.endswith(".sh"):
            out.append((rel, "#"))
        elif rel == ".ci/run":
            out.append((rel, "#"))
    return sorted(out)


CD_RE = re.compile(r"^\s*(?:\$\s*)?cd\s+([^\s;&|)]+)", re.M)
FENCE_RE = re.compile(r"^\s*(```|~~~)")


def markdown_blocks(text):
    """[(first line, text, in a code fence)]: the page cut at its code fences."""
    blocks, cur, start, fenced = [], [], 1, False
    for n, line in enumerate(text.split("\n"), 1):
        if FENCE_RE.match(line):
            if cur:
                blocks.append((start, "\n".join(cur), fenced))
            cur, start, fenced = [], n + 1, not fenced
            continue
        cur.append(line)
    if cur:
        blocks.append((start, "\n".join(cur), fenced))
    return blocks


def rust_comments(text):
    """{line: comment text} of the `//` comments (strings and char literals skipped)."""
    out = {}
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out[line] = re.sub(r"^//[/!]?", "", text[i:j])
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
            line += text.count("\n", i, j)
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            end = n if end < 0 else end + 1 + len(hashes)
            line += text.count("\n", i, end)
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            line += text.count("\n", i, j)
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 12]):
            j = text.find("'", i + 2 if text[i + 1] == "\\" else i + 1)
            i = j + 1
        else:
            i += 1
    return out


PY_TOKEN_RE = re.compile(r"#|\"\"\"|'''|\"|'")


def python_comments(text):
    """{line: comment text} of the `#` comments of a Python file (none in a string)."""
    out = {}
    delim = None  # the quotes of the triple-quoted string still open, if any
    for n, raw in enumerate(text.split("\n"), 1):
        i = 0
        while i <= len(raw):
            if delim:
                j = raw.find(delim, i)
                if j < 0:
                    break
                delim, i = None, j + 3
                continue
            m = PY_TOKEN_RE.search(raw, i)
            if not m:
                break
            tok = m.group(0)
            if tok == "#":
                if not (n == 1 and raw.startswith("#!")):
                    out[n] = raw[m.end():].lstrip("#")
                break
            if len(tok) == 3:
                delim, i = tok, m.end()
                continue
            j = m.end()
            while j < len(raw) and raw[j] != tok:
                j += 2 if raw[j] == "\\" else 1
            i = j + 1
    return out


def shell_comments(text):
    """{line: comment text} of the `#` comments of a shell script: whole-line ones, and a
    trailing ` # ...` after code whose quotes are balanced (not the shebang)."""
    out = {}
    for n, raw in enumerate(text.split("\n"), 1):
        s = raw.lstrip()
        if s.startswith("#!") and n == 1:
            continue
        if s.startswith("#"):
            out[n] = s.lstrip("#")
            continue
        m = re.search(r"\s#\s", raw)
        if m and raw[: m.start()].count('"') % 2 == 0 and raw[: m.start()].count("'") % 2 == 0:
            out[n] = raw[m.end():]
    return out


def comment_blocks(comments):
    """[(first line, text)]: consecutive comment lines joined, so a citation may wrap."""
    blocks, cur, start, prev = [], [], None, None
    for n in sorted(comments):
        if prev is not None and n != prev + 1:
            blocks.append((start, "\n".join(cur)))
            cur = []
        if not cur:
            start = n
        cur.append(comments[n])
        prev = n
    if cur:
        blocks.append((start, "\n".join(cur)))
    return blocks


# ---------------------------------------------------------------------------------------
# Paths.

CODE_RE = re.compile(r"(`+)(.+?)\1", re.S)
LINK_RE = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^()\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_LINK_RE = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
PLAIN_RE = re.compile(r"(?<![\w./~$@:<>*?-])((?:\.\.?/)*[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)+/?)(?![<{*$\w/-])")
EXT_RE = re.compile(r"\.(" + "|".join(EXTENSIONS) + r")$")


def strip_token(tok):
    """A cited token without what surrounds the path: quotes, punctuation, a line number
    (`a.rs:12`), an item (`a.rs::f`), an anchor (`a.md#x`)."""
    tok = tok.strip().strip("\"'()[],;")
    tok = re.sub(r"#.*$", "", tok)
    tok = re.sub(r"::.*$", "", tok)
    tok = re.sub(r"(:\d+)+(-\d+)?$", "", tok)
    tok = tok.rstrip(".,;:!?")
    return tok


def is_placeholder(tok):
    if re.search(r"[<>{}*?$%\[\]|=@]|\.\.\.", tok):
        return True
    if tok.startswith(("/", "~", "-")) or "://" in tok or tok.startswith(("http:", "https:", "mailto:")):
        return True
    first = re.sub(r"^(\.\.?/)+", "", tok).split("/")[0]
    if first in ("target", ".local", "tmp"):
        return True
    for seg in tok.strip("/").split("/"):
        words = re.split(r"[-_.]", seg)
        if any(w in PLACEHOLDER_WORDS for w in words):
            return True
        if re.fullmatch(r"[A-Z][A-Z_]*", seg):  # an extensionless all-capitals segment
            return True
    return False


def looks_like_path(tok):
    """'path' (has a slash: a file with a known extension, or a folder), 'name' (a bare
    file name with a known extension), or None."""
    if not tok or is_placeholder(tok):
        return None
    if not re.fullmatch(r"[A-Za-z0-9_./-]+", tok) or tok in ("/", "./", "../"):
        return None
    if "/" in tok:
        if tok.endswith("/"):
            return "path"
        return "path" if EXT_RE.search(tok) else None
    stem, _, ext = tok.rpartition(".")
    if ext in NAME_EXTENSIONS and re.match(r"[A-Za-z0-9_-]*[A-Za-z]", stem):
        return "name"
    return None


def path_citations(text, fenced, markdown, top_dirs):
    """[(offset, token, kind)] of the paths a block cites: in backticks, in links, and in
    plain text with a slash and an extension (or a folder of the root's); inside a code
    fence, paths with a slash that start at a folder of the root's or follow a `cd`."""
    out = []
    taken = []
    if not fenced:
        for m in CODE_RE.finditer(text):
            taken.append((m.start(), m.end()))
            for t in re.finditer(r"[^\s`]+", m.group(2)):
                tok = strip_token(t.group(0))
                kind = looks_like_path(tok)
                if kind:
                    out.append((m.start(2) + t.start(), tok, kind))
        if markdown:
            for rx in (LINK_RE, REF_LINK_RE):
                for m in rx.finditer(text):
                    if any(a <= m.start() < b for a, b in taken):
                        continue
                    taken.append((m.start(), m.end()))
                    tok = strip_token(m.group(1))
                    if not tok or is_placeholder(tok) or re.match(r"^[a-z]+:", tok):
                        continue
                    out.append((m.start(1), tok, "link"))
    for m in PLAIN_RE.finditer(text):
        if any(a <= m.start() < b for a, b in taken):
            continue
        tok = strip_token(m.group(1))
        kind = looks_like_path(tok)
        if kind != "path":
            continue
        first = tok.split("/")[0]
        if (tok.endswith("/") or fenced) and first not in top_dirs:
            if not (fenced and CD_RE.search(text, 0, m.start())):
                continue
        out.append((m.start(1), tok, kind))
    return out


# ---------------------------------------------------------------------------------------
# Numbered lists and headings.

HEADING_RE = re.compile(r"^#{2,6}\s+(\d+(?:\.\d+)*)\.?\s", re.M)


def numbered_sections(text):
    return set(HEADING_RE.findall(text))


def numbered_list(text, heading_re):
    """The numbers of the top-level numbered list in the section whose heading matches."""
    m = re.search(heading_re, text, re.M)
    if not m:
        return None
    body = text[m.end():]
    nxt = re.search(r"^## ", body, re.M)
    body = body[: nxt.start()] if nxt else body
    return {int(x) for x in re.findall(r"^(\d+)\.\s", body, re.M)}


NUMS = r"\d+(?:\s*(?:,\s*(?:and\s+|or\s+)?|\band\b|\bor\b|-|–|\bto\b)\s*\d+)*"
INVARIANT_RE = re.compile(r"\b(structural\s+)?invariants?\s+#?(" + NUMS + r")\b", re.I)
SECNUM = r"\d+(?:\.\d+)*"
SECNUMS = SECNUM + r"(?:\s*(?:,\s*(?:and\s+|or\s+)?|\band\b|\bor\b|-|–|\bto\b)\s*" + SECNUM + r")*"
SECTION_RE = re.compile(
    r"(?:`?([A-Za-z0-9_./-]+\.md)`?,?\s+)?(?:\b[Ss]ections?\s+|§\s*)(" + SECNUMS + r")(?![\d.]*\d)"
)
ITEM_RE = re.compile(r"\((items?\s+\d+(?:\s*(?:,|and|-|–)\s*\d+)*)\)")


def expand(nums):
    """'6-9' -> [6, 7, 8, 9]; '2, 10 and 15' -> [2, 10, 15]."""
    out = []
    for m in re.finditer(r"(\d+)(?:\s*(?:-|–|\bto\b)\s*(\d+))?", nums):
        a = int(m.group(1))
        b = int(m.group(2)) if m.group(2) else a
        out.extend(range(a, b + 1) if b >= a and b - a < 100 else [a, b])
    return out


def expand_sections(nums):
    parts = re.split(r"\s*(?:,\s*(?:and\s+|or\s+)?|\band\b|\bor\b)\s*", nums)
    out = []
    for p in parts:
        r = re.fullmatch(r"(\d+)\s*(?:-|–|to)\s*(\d+)", p.strip())
        if r and int(r.group(2)) - int(r.group(1)) < 100:
            out.extend(str(x) for x in range(int(r.group(1)), int(r.group(2)) + 1))
        else:
            out.extend(x for x in re.split(r"\s*(?:-|–|\bto\b)\s*", p.strip()) if x)
    return out


# ---------------------------------------------------------------------------------------


def read_allow(root):
    path = os.path.join(root, ALLOW)
    out = []
    if not os.path.exists(path):
        return out
    for raw in read(path).splitlines():
        line = raw.split(" #")[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        file_pat, _, text_pat = line.partition(":")
        out.append((file_pat.strip(), text_pat.strip()))
    return out


def allowed(allow, rel, cited):
    return any(fnmatch.fnmatchcase(rel, f) and fnmatch.fnmatchcase(cited, t) for f, t in allow)


def line_at(start, text, offset):
    return start + text.count("\n", 0, offset)


def check(root):
    repo = Repo(root)
    allow = read_allow(root)
    top_dirs = {d for d in repo.dirs if d and "/" not in d}
    design_text = read(os.path.join(root, DESIGN)) if DESIGN in repo.files else ""
    arch_text = read(os.path.join(root, ARCHITECTURE)) if ARCHITECTURE in repo.files else ""
    invariants = numbered_list(design_text, r"^## (?:\d+\.\s*)?Invariants\s*$")
    structural = numbered_list(arch_text, r"^## (?:\d+\.\s*)?Structural invariants\s*$")
    sections_of = {}

    def sections(rel):
        if rel not in sections_of:
            sections_of[rel] = numbered_sections(read(os.path.join(root, rel)))
        return sections_of[rel]

    problems = []
    counts = {"files": 0, "paths": 0, "invariants": 0}

    def report(rel, line, what, cited):
        cited = " ".join(cited.split())
        if not allowed(allow, rel, cited):
            problems.append((rel, line, f"{rel}:{line}: {what} ({cited})"))

    def scan(rel, blocks, markdown):
        citing_dir = rel.rsplit("/", 1)[0] if "/" in rel else ""
        own_sections = sections(rel) if markdown else set()
        for start, text, fenced in blocks:
            for off, tok, kind in path_citations(text, fenced, markdown, top_dirs):
                counts["paths"] += 1
                line = line_at(start, text, off)
                extra = []
                if fenced:
                    cds = [c.group(1) for c in CD_RE.finditer(text, 0, off) if not is_placeholder(c.group(1))]
                    extra = [normalize(cds[-1])] if cds and normalize(cds[-1]) is not None else []
                if repo.ignored(tok) or any(repo.ignored(join(e, tok)) for e in extra):
                    continue
                if kind == "name":
                    if tok not in repo.names:
                        report(rel, line, "no file of this name in the repository", tok)
                elif repo.find(tok, citing_dir, extra) is None:
                    report(rel, line, "no such file or folder", tok)
            if fenced:
                continue
            for m in INVARIANT_RE.finditer(text):
                line = line_at(start, text, m.start())
                before = text[max(0, m.start() - 40): m.start()]
                arch = bool(m.group(1)) or "ARCHITECTURE.md" in before
                if arch:
                    known, where = structural, f"{ARCHITECTURE} Structural invariants"
                else:
                    known, where = invariants, f"{DESIGN} Invariants"
                for n in expand(m.group(2)):
                    counts["invariants"] += 1
                    if known is None:
                        report(rel, line, f"no numbered list in {where}", m.group(0))
                    elif n not in known:
                        report(rel, line, f"no invariant {n} in {where}", m.group(0))
            for m in SECTION_RE.finditer(text):
                line = line_at(start, text, m.start(2) if m.group(1) is None else m.start())
                cited = m.group(0).replace("`", "")
                if m.group(1):
                    target = repo.find(m.group(1).strip("`"), citing_dir)
                    if target is None:
                        names = repo.names.get(m.group(1).rsplit("/", 1)[-1], [])
                        target = names[0] if len(names) == 1 else None
                    if target is None:
                        continue  # the path itself is reported above
                elif markdown and own_sections:
                    target = rel
                elif DESIGN in repo.files:
                    target = DESIGN
                else:
                    continue
                for s in expand_sections(m.group(2)):
                    if s not in sections(target):
                        report(rel, line, f"no section {s} in {target}", cited)
            for m in ITEM_RE.finditer(text):
                report(rel, line_at(start, text, m.start()),
                       "ambiguous reference: a position in a list it does not name", m.group(1))

    for rel in pages(repo):
        counts["files"] += 1
        scan(rel, markdown_blocks(read(os.path.join(root, rel))), True)
    for rel, syntax in sources(repo):
        counts["files"] += 1
        text = read(os.path.join(root, rel))
        if syntax == "//":
            comments = rust_comments(text)
        else:
            comments = python_comments(text) if rel.endswith(".py") else shell_comments(text)
        scan(rel, [(s, t, False) for s, t in comment_blocks(comments)], False)

    seen, out = set(), []
    for rel, line, msg in sorted(problems, key=lambda p: (p[0], p[1], p[2])):
        if msg not in seen:
            seen.add(msg)
            out.append(msg)
    summary = (
        f"docs: {counts['files']} files, {counts['paths']} paths, "
        f"{counts['invariants']} invariant citations, {len(out)} problems"
    )
    return summary, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    args = ap.parse_args()
    summary, problems = check(os.path.abspath(args.root))
    for p in problems:
        print(p)
    print(summary)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
