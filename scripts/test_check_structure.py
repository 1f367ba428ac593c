"""The structure check (scripts/check-structure.py) on small made-up trees: it passes a
clean one and fails on an injected circle, an upward import, a module in no layer and
rdkafka outside src/kafka/.

    python3 -m unittest discover -s scripts -p 'test_check_structure.py'
"""
import importlib.util
import os
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("check_structure", os.path.join(HERE, "check-structure.py"))
check_structure = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_structure)

ARCHITECTURE = """# Architecture

## Layers

| layer | modules |
| --- | --- |
| binary | `main.rs` |
| roles | `processor/` (the worker) |
| storage | `sysdb/` |
| foundations | `positions.rs`, `kafka/` |

## Code map
"""

CLEAN = {
    "main.rs": "use sluice::processor::run;\nfn main() { run(); }\n",
    "lib.rs": "pub mod processor;\npub mod sysdb;\npub mod positions;\npub mod kafka;\n",
    "processor/mod.rs": "mod worker;\npub use worker::run;\n",
    "processor/worker.rs": "use crate::sysdb::Sysdb;\nuse super::shared::Limit;\npub fn run() {}\n",
    "processor/shared.rs": "pub struct Limit;\n",
    "sysdb/mod.rs": "mod types;\nmod sqlite;\npub use types::Row;\npub struct Sysdb;\nfn open() { sqlite::open(); }\n",
    "sysdb/types.rs": "use crate::positions::Delta;\npub struct Row;\n",
    "sysdb/sqlite.rs": "use super::types::Row;\n// super::Sysdb in a comment is no import\npub fn open() { let _ = \"crate::processor\"; }\n",
    "positions.rs": "pub struct Delta;\n",
    "kafka/mod.rs": "use rdkafka::ClientConfig;\n",
}


def make(root, files):
    with open(os.path.join(root, "ARCHITECTURE.md"), "w") as f:
        f.write(ARCHITECTURE)
    for rel, text in files.items():
        path = os.path.join(root, "src", rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(textwrap.dedent(text))


class StructureCheck(unittest.TestCase):
    def problems(self, **changes):
        files = dict(CLEAN)
        files.update(changes)
        with tempfile.TemporaryDirectory(prefix="check-structure-") as root:
            make(root, files)
            return check_structure.check(root)[1]

    def test_a_clean_tree_passes(self):
        self.assertEqual(self.problems(), [])

    def test_a_circle_fails(self):
        # The backend imports the front's item, and the front calls the backend: a circle
        # inside sysdb/.
        p = self.problems(**{"sysdb/sqlite.rs": "use super::Sysdb;\npub fn open() {}\n"})
        self.assertTrue(any("circle" in x and "sysdb/mod.rs" in x and "sysdb/sqlite.rs" in x for x in p), p)

    def test_an_upward_import_fails(self):
        p = self.problems(**{"positions.rs": "use crate::sysdb::Sysdb;\npub struct Delta;\n"})
        self.assertTrue(any("above it" in x and "positions.rs" in x for x in p), p)

    def test_a_module_in_no_layer_fails(self):
        p = self.problems(**{"lib.rs": CLEAN["lib.rs"] + "pub mod stray;\n", "stray.rs": "\n"})
        self.assertTrue(any("src/stray" in x and "no layer" in x for x in p), p)

    def test_rdkafka_outside_kafka_fails(self):
        p = self.problems(**{"positions.rs": "pub fn f() { let _ = rdkafka::Offset::End; }\n"})
        self.assertTrue(any("rdkafka" in x and "positions.rs" in x for x in p), p)

    def test_use_trees_and_child_modules_are_followed(self):
        p = self.problems(**{"sysdb/types.rs": "use crate::{positions::Delta, processor::run};\npub struct Row;\n"})
        self.assertTrue(any("above it" in x and "processor" in x for x in p), p)


if __name__ == "__main__":
    unittest.main()
