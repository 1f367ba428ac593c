"""The docs check (scripts/check-docs.py) on small made-up trees: it passes a clean one and
reports a missing path, a missing bare file name, an invariant or a section that does not
exist and an ambiguous "(item N)", in pages and in comments; it leaves alone what it should
(URLs, placeholders, git-ignored paths, docs/bench/history.md, the allow-list's entries).

    python3 -m unittest discover -s scripts -p 'test_check_docs.py'
"""
import importlib.util
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("check_docs", os.path.join(HERE, "check-docs.py"))
check_docs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_docs)

DESIGN = """\
# Design

## 1. What it is

### 1.1 Words

## 2. Positions

## 8. Invariants

1. **Authoritative seek.** Tested by `src/lib.rs`.
2. **One transaction per batch.** Tested by `sysdb_tests.rs`.
3. **The group offset lags.**

## 9. Limits

(invariants 1, 2 and 3)
"""

ARCHITECTURE = """\
# Architecture

| path | what |
| --- | --- |
| `src/sysdb/` | the front (`mod.rs`) and the backends (`sqlite/`) |
| `base/` | the foundations (`positions.rs`) |

## Structural invariants

1. Nothing outside `kafka/` names rdkafka.
2. Imports point down.
"""

CLEAN = {
    ".gitignore": "/target\n/.local/\n/fuzz/corpus\n",
    "README.md": """\
        # Sluice

        See `ARCHITECTURE.md`, [the design](docs/design.md) and `docs/design.md` section 1.1.
        Run `scripts/test.sh --quick`; logs go to `.local/kafka/log/`, builds to `target/`.
        A config file such as `sluice.toml` is no repository path; neither is `suite-<date>-<commit>.json`, `docs/bench/suite-*.json`, `PATH/FILE.rs`,
        https://example.com/a/b.rs, `/etc/sluice/sluice.toml` nor `src/.../x.rs`.

        ```sh
        scripts/test.sh
        cd integration-tests/java
        java src/Main.java ../../docs/design.md
        ```
        """,
    "ARCHITECTURE.md": ARCHITECTURE,
    "docs/design.md": DESIGN,
    "docs/operations.md": """\
        Back to the [README](../README.md) or [design](design.md#8-invariants); invariant 2
        of the design, structural invariant 1, and §2 of [it](./design.md).
        """,
    "docs/bench/history.md": "Then `src/old_place.rs` did it (invariant 99, item 3).\n",
    "scripts/test.sh": """\
        #!/usr/bin/env bash
        # The test command (see docs/operations.md and `scripts/tool.py`).
        echo "# not a comment: src/nothing.rs"
        ls fuzz/corpus/ # grown by earlier runs: fuzz/corpus/seeds.txt
        """,
    "scripts/tool.py": '''\
        """A tool.

        # not a comment: `src/absent.rs`
        """
        # Reads deploy/local/kafka.sh output.
        x = "# src/absent.rs"
        ''',
    "deploy/local/kafka.sh": "#!/bin/sh\n# Writes .local/kafka/ (see README.md).\n",
    "integration-tests/java/src/Main.java": "class Main {}\n",
    "src/lib.rs": """\
        //! The library (docs/design.md section 2, invariants 1-3).
        //! Backends: `sysdb/sqlite/mod.rs`, `positions.rs`, `kafka/` and `sqlite/`, see
        //! docs/design.md
        //! section 8 and `base/src/positions.rs` (design.md invariant 2).
        pub mod sysdb;
        const DOC: &str = "src/nowhere.rs // `gone.rs`";
        fn f() -> char { '"' } // `tests/sysdb_tests.rs`
        """,
    "src/sysdb/mod.rs": "/// The front; see `sqlite/mod.rs` and `../lib.rs`.\npub mod sqlite;\n",
    "src/sysdb/sqlite/mod.rs": "// SQLite.\n",
    "base/src/positions.rs": "/// Offsets only move forward (design.md invariant 3).\n",
    "base/src/lib.rs": "pub mod positions;\n",
    "kafka/src/lib.rs": "// The only rdkafka user (structural invariant 1).\n",
    "integration-tests/tests/sysdb_tests.rs": "// See docs/design.md §1 and section 2.\n",
}


def make(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(textwrap.dedent(text))


class DocsCheck(unittest.TestCase):
    def run_check(self, **changes):
        files = dict(CLEAN)
        files.update({k.replace("__", "/").replace("_DOT_", "."): v for k, v in changes.items()})
        with tempfile.TemporaryDirectory(prefix="check-docs-") as root:
            make(root, files)
            return check_docs.check(root)

    def problems(self, **changes):
        return self.run_check(**changes)[1]

    def assertReported(self, problems, *parts):
        self.assertTrue(any(all(p in x for p in parts) for x in problems), (parts, problems))

    def test_a_clean_tree_passes(self):
        summary, problems = self.run_check()
        self.assertEqual(problems, [])
        self.assertRegex(summary, r"^docs: \d+ files, \d+ paths, \d+ invariant citations, 0 problems$")

    def test_a_missing_path_in_a_page_fails_with_file_and_line(self):
        p = self.problems(docs__operations_DOT_md="Intro.\n\nThe consumer is `src/kafka/consumer.rs`.\n")
        self.assertEqual(p, ["docs/operations.md:3: no such file or folder (src/kafka/consumer.rs)"])

    def test_a_missing_folder_and_a_broken_link_fail(self):
        p = self.problems(docs__operations_DOT_md="In `src/kafka/`; see [it](missing.md) and [ok](design.md).\n")
        self.assertReported(p, "docs/operations.md:1", "(src/kafka/)")
        self.assertReported(p, "docs/operations.md:1", "(missing.md)")
        self.assertEqual(len(p), 2, p)

    def test_a_stale_path_in_a_comment_fails(self):
        p = self.problems(src__sysdb__mod_DOT_rs="/// See `sysdb/sqlite.rs` and\n/// src/sysdb/schema.rs.\npub mod sqlite;\n")
        self.assertReported(p, "src/sysdb/mod.rs:1", "(sysdb/sqlite.rs)")
        self.assertReported(p, "src/sysdb/mod.rs:2", "(src/sysdb/schema.rs)")

    def test_short_paths_resolve_under_src_and_the_crates(self):
        # `sysdb/sqlite/mod.rs` is under src/, `src/lib.rs` under base/ and kafka/ too,
        # `positions.rs` under base/src/: all fine. The src/ spelling of the last is none of them.
        p = self.problems(kafka__src__lib_DOT_rs="// `sysdb/sqlite/mod.rs`, `src/lib.rs`, `positions.rs`, `src/positions.rs`.\n")
        self.assertEqual(p, ["kafka/src/lib.rs:1: no such file or folder (src/positions.rs)"])

    def test_a_missing_bare_file_name_fails(self):
        p = self.problems(src__sysdb__sqlite__mod_DOT_rs="// Migrations in `schema.rs`; rows in `mod.rs`.\n")
        self.assertEqual(p, ["src/sysdb/sqlite/mod.rs:1: no file of this name in the repository (schema.rs)"])

    def test_shell_and_python_comments_are_read_but_not_strings(self):
        p = self.problems(
            scripts__test_DOT_sh="#!/bin/sh\n# Runs scripts/gone.sh.\necho '# scripts/ok.sh'\n",
            scripts__tool_DOT_py='"""# `src/absent.rs`"""\nx = 1  # see `src/sysdb/sqlite.rs`\n'
            "y = '''\n\"\"\"\n# `src/quoted.rs`\n'''  # `src/after.rs`\n",
        )
        self.assertEqual(sorted(p), [
            "scripts/test.sh:2: no such file or folder (scripts/gone.sh)",
            "scripts/tool.py:2: no such file or folder (src/sysdb/sqlite.rs)",
            "scripts/tool.py:6: no such file or folder (src/after.rs)",
        ])

    def test_a_code_fence_is_read_with_its_cd(self):
        p = self.problems(README_DOT_md="```sh\nscripts/gone.sh\ncd integration-tests/java\njava src/Other.java\n```\n")
        self.assertEqual(sorted(p), [
            "README.md:2: no such file or folder (scripts/gone.sh)",
            "README.md:4: no such file or folder (src/Other.java)",
        ])

    def test_git_ignored_paths_are_not_checked(self):
        self.assertEqual(self.problems(scripts__test_DOT_sh="# Writes fuzz/corpus/x/ and fuzz/corpus/a.txt.\n"), [])

    def test_history_is_not_checked(self):
        # CLEAN's history.md cites a moved file, an invariant and an item that do not exist:
        # nothing is reported.
        files = dict(CLEAN)
        self.assertIn("old_place", files["docs/bench/history.md"])
        self.assertEqual(self.problems(), [])
        # The same text in another page is reported.
        p = self.problems(docs__soak_DOT_md=CLEAN["docs/bench/history.md"])
        self.assertReported(p, "docs/soak.md:1", "src/old_place.rs")
        self.assertReported(p, "docs/soak.md:1", "invariant 99")

    def test_the_allow_list_silences_only_its_entries(self):
        page = "Writes `out/report.json` and `out/other.json`.\n"
        p = self.problems(docs__soak_DOT_md=page)
        self.assertEqual(len(p), 2, p)
        allow = "# The run's output folder, not the repository's.\ndocs/soak.md:out/report.json\n"
        p = self.problems(docs__soak_DOT_md=page, **{"scripts/check-docs.allow": allow})
        self.assertEqual(p, ["docs/soak.md:1: no such file or folder (out/other.json)"])
        p = self.problems(docs__soak_DOT_md=page, **{"scripts/check-docs.allow": "docs/*.md:out/*\n"})
        self.assertEqual(p, [])

    def test_an_invariant_that_does_not_exist_fails(self):
        p = self.problems(src__sysdb__sqlite__mod_DOT_rs="// (design.md invariant 4); invariants 2-5.\n")
        self.assertEqual(sorted(p), [
            "src/sysdb/sqlite/mod.rs:1: no invariant 4 in docs/design.md Invariants (invariant 4)",
            "src/sysdb/sqlite/mod.rs:1: no invariant 4 in docs/design.md Invariants (invariants 2-5)",
            "src/sysdb/sqlite/mod.rs:1: no invariant 5 in docs/design.md Invariants (invariants 2-5)",
        ])

    def test_invariant_lists_and_wrapped_citations(self):
        p = self.problems(docs__soak_DOT_md="Kept (invariants 1, 3\nand 7); also design.md\ninvariant 9.\n")
        self.assertEqual(sorted(p), [
            "docs/soak.md:1: no invariant 7 in docs/design.md Invariants (invariants 1, 3 and 7)",
            "docs/soak.md:3: no invariant 9 in docs/design.md Invariants (invariant 9)",
        ])

    def test_structural_invariants_are_those_of_architecture(self):
        p = self.problems(kafka__src__lib_DOT_rs="// structural invariant 2; structural invariant 3.\n")
        self.assertEqual(p, ["kafka/src/lib.rs:1: no invariant 3 in ARCHITECTURE.md Structural invariants (structural invariant 3)"])

    def test_a_section_that_does_not_exist_fails(self):
        p = self.problems(
            base__src__positions_DOT_rs="/// docs/design.md section 5.5, §1.1 and\n/// `design.md` §1.2; sections 1-2.\n",
            docs__operations_DOT_md="See [the design](design.md) section 3 and design.md §8.\n",
        )
        self.assertEqual(sorted(p), [
            "base/src/positions.rs:1: no section 5.5 in docs/design.md (docs/design.md section 5.5)",
            "base/src/positions.rs:2: no section 1.2 in docs/design.md (design.md §1.2)",
            "docs/operations.md:1: no section 3 in docs/design.md (section 3)",
        ])

    def test_a_bare_section_in_a_numbered_page_is_its_own(self):
        page = "# Guide\n\n## 1. Start\n\n## 2. Stop\n\nAs in section 2; not section 3.\n"
        p = self.problems(docs__guide_DOT_md=page)
        self.assertEqual(p, ["docs/guide.md:7: no section 3 in docs/guide.md (section 3)"])

    def test_an_item_reference_is_ambiguous(self):
        p = self.problems(kafka__src__lib_DOT_rs="// Never assign then seek (item 2).\n// (issue 7, item 4)\n")
        self.assertEqual(p, ["kafka/src/lib.rs:1: ambiguous reference: a position in a list it does not name (item 2)"])

    def test_the_script_prints_and_exits_1_on_problems(self):
        files = dict(CLEAN)
        files["docs/soak.md"] = "See `docs/gone.md`.\n"
        with tempfile.TemporaryDirectory(prefix="check-docs-") as root:
            make(root, files)
            run = subprocess.run([sys.executable, os.path.join(HERE, "check-docs.py"), "--root", root],
                                 capture_output=True, text=True)
            self.assertEqual(run.returncode, 1, run.stderr)
            lines = run.stdout.splitlines()
            self.assertEqual(lines[0], "docs/soak.md:1: no such file or folder (docs/gone.md)")
            self.assertRegex(lines[-1], r"^docs: \d+ files, \d+ paths, \d+ invariant citations, 1 problems$")
            os.remove(os.path.join(root, "docs/soak.md"))
            run = subprocess.run([sys.executable, os.path.join(HERE, "check-docs.py"), "--root", root],
                                 capture_output=True, text=True)
            self.assertEqual(run.returncode, 0, run.stdout)


if __name__ == "__main__":
    unittest.main()
