"""Tests of examples/functions/reference.py, the oracle of the example functions: its fold
and outputs on sample.jsonl against values worked out by hand, and its incremental form
(the logic of the components) folded over random logs against its outputs.

    python3 -m unittest discover -s examples/functions -p 'test_*.py'
"""
import json
import os
import random
import unittest

import reference

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE = os.path.join(HERE, "sample.jsonl")

WORD_COUNT = '{"key": "genre"}'
NORM_GUARD = '{"min": 0.5, "max": 2}'
PROJECT_KEYS = '{"keep": ["genre", "year"]}'


def sample_lines():
    with open(SAMPLE, encoding="utf-8") as f:
        return f.read().splitlines()


def folded(function, params_text, changes):
    params = reference.parse_params(function, params_text)
    outputs = {}
    for change in changes:
        reference.apply_deltas(outputs, reference.DELTAS[function](change, params))
    return outputs


class SampleByHand(unittest.TestCase):
    """sample.jsonl, line by line (offset: what it does):

    0 add b1 [1,0] fiction 1999 en, 4 words    1 add b2 [3,4] poetry 2005, 3 words
    2 add b3 [0.1,0.2] fiction draft, 5 words   3 add b1: ignored (b1 exists)
    4 update b9: ignored (absent)               5 update b2: fiction, year removed, 6 words
    6 upsert b4 (insert) [0,0.3] essay 2010 4.5, lang null dropped, 2 words
    7 upsert b3 (merge) [1,1], draft removed    8 add b5 [1,2,3]: rejected (dimension 2)
    9 delete b1                                 10 delete b1: ignored (absent)
    11 add b6 genre=7 (a long), 7 words, no embedding
    12 upsert b4 (merge) year 2011, document kept
    13 add b7 [0,0] year 1999, no genre         14 upsert b1 (insert) [2,0.0001] poetry 2020, 2 words
    15 add b8 [0,2], no metadata, no document
    """

    def test_the_fold_applies_inserts_merges_and_deletes_and_skips_the_rest(self):
        log = reference.read_log(sample_lines())
        records, changes = reference.fold(log, "books")
        self.assertEqual(sorted(records), ["b1", "b2", "b3", "b4", "b6", "b7", "b8"])
        self.assertEqual([c.offset for c in changes], [0, 1, 2, 5, 6, 7, 9, 11, 12, 13, 14, 15])
        self.assertEqual(records["b2"].metadata, {"genre": "fiction"})
        self.assertEqual(records["b2"].embedding, [3.0, 4.0])
        self.assertEqual(records["b2"].offset, 5)
        self.assertEqual(records["b3"].metadata, {"genre": "fiction"})
        self.assertEqual(records["b3"].document, "a tale of two cities")
        self.assertEqual(records["b4"].metadata, {"genre": "essay", "year": 2011, "rating": 4.5})
        self.assertEqual(records["b4"].document, "on liberty")
        self.assertEqual(records["b1"].offset, 14)
        self.assertEqual(records["b8"].metadata, {})
        deletes = [c for c in changes if c.after is None]
        self.assertEqual([(c.id, c.offset, c.before.offset) for c in deletes], [("b1", 9, 0)])

    def test_word_count(self):
        expected = {
            "s:fiction": {"key": "genre", "value": "fiction", "words": 6 + 5},  # b2, b3
            "s:poetry": {"key": "genre", "value": "poetry", "words": 2},  # b1 re-added
            "s:essay": {"key": "genre", "value": "essay", "words": 2},  # b4
            "l:7": {"key": "genre", "value": 7, "words": 7},  # b6
        }
        self.assertEqual(reference.expected_outputs("word_count", WORD_COUNT, sample_lines()), expected)

    def test_norm_guard(self):
        # above 2: b2 (5.0), b1 (sqrt(4 + 1e-8)); below 0.5: b4 (0.3), b7 (0.0). Inside:
        # b3 (sqrt 2), b8 (exactly 2.0: the bounds are inclusive). b6 has no embedding.
        expected = {
            "above": {"min": 0.5, "max": 2.0, "count": 2},
            "below": {"min": 0.5, "max": 2.0, "count": 2},
        }
        self.assertEqual(reference.expected_outputs("norm_guard", NORM_GUARD, sample_lines()), expected)

    def test_project_keys(self):
        expected = {
            "b1": {"genre": "poetry", "year": 2020},
            "b2": {"genre": "fiction"},
            "b3": {"genre": "fiction"},
            "b4": {"genre": "essay", "year": 2011},
            "b6": {"genre": 7},
            "b7": {"year": 1999},
            "b8": {},
        }
        self.assertEqual(reference.expected_outputs("project_keys", PROJECT_KEYS, sample_lines()), expected)

    def test_count_records(self):
        # b1 b2 b3 b4 b6 b7 b8 live (b1 deleted, then upserted again; b5 never stored).
        expected = {"function_output": {"total_count": 7}}
        self.assertEqual(reference.expected_outputs("count_records", "{}", sample_lines()), expected)

    def test_the_deltas_of_every_change_end_at_the_outputs(self):
        changes = reference.changes_of(sample_lines())
        for function, params in (
            ("word_count", WORD_COUNT),
            ("norm_guard", NORM_GUARD),
            ("project_keys", PROJECT_KEYS),
            ("count_records", "{}"),
        ):
            with self.subTest(function=function):
                self.assertEqual(
                    folded(function, params, changes),
                    reference.expected_outputs(function, params, sample_lines()),
                )

    def test_the_deltas_of_single_changes(self):
        changes = {c.offset: c for c in reference.changes_of(sample_lines())}
        word_count = reference.parse_params("word_count", WORD_COUNT)
        # b2 moves from poetry (3 words) to fiction (6 words).
        self.assertEqual(
            reference.word_count_deltas(changes[5], word_count),
            [
                ("count", "s:fiction", {"key": "genre", "value": "fiction"}, "words", 6, True),
                ("count", "s:poetry", {"key": "genre", "value": "poetry"}, "words", -3, True),
            ],
        )
        # b3's merge keeps its genre and its words: nothing.
        self.assertEqual(reference.word_count_deltas(changes[7], word_count), [])
        norm_guard = reference.parse_params("norm_guard", NORM_GUARD)
        # b3 goes from below (0.22) to inside (1.41).
        self.assertEqual(
            reference.norm_guard_deltas(changes[7], norm_guard),
            [("count", "below", {"min": 0.5, "max": 2.0}, "count", -1, True)],
        )
        project_keys = reference.parse_params("project_keys", PROJECT_KEYS)
        self.assertEqual(reference.project_keys_deltas(changes[9], project_keys), [("remove", "b1", 9)])
        self.assertEqual(
            reference.project_keys_deltas(changes[12], project_keys),
            [("put", "b4", {"genre": "essay", "year": 2011}, 12)],
        )
        self.assertEqual(reference.count_records_deltas(changes[9], {}), [("count", "function_output", {}, "total_count", -1, False)])
        self.assertEqual(reference.count_records_deltas(changes[7], {}), [])


class Values(unittest.TestCase):
    def test_metadata_numbers_are_longs_when_they_fit_in_64_bits(self):
        self.assertEqual(reference.meta_value(2**63 - 1), 2**63 - 1)
        self.assertIsInstance(reference.meta_value(2**63), float)
        self.assertIs(reference.meta_value(True), True)
        self.assertEqual(reference.tag(True), "boolean")
        self.assertEqual(reference.tag(1), "long")
        self.assertEqual(reference.tag(1.0), "double")

    def test_embeddings_are_float32(self):
        self.assertEqual(reference.f32(0.1), 0.10000000149011612)
        self.assertEqual(reference.f32(3), 3.0)

    def test_word_count_ids(self):
        self.assertEqual(reference.value_id("red"), "s:red")
        self.assertEqual(reference.value_id(-42), "l:-42")
        self.assertEqual(reference.value_id(0.5), "d:0.5")
        self.assertEqual(reference.value_id(-0.0), "d:-0.0")
        self.assertEqual(reference.value_id(False), "b:false")
        long_id = reference.value_id("x" * 300)
        self.assertTrue(long_id.startswith("h:") and len(long_id) == 2 + 64, long_id)
        self.assertEqual(reference.words("  two\twords\n"), 2)
        self.assertEqual(reference.words(None), 0)

    def test_params_are_checked(self):
        for function, params in (
            ("word_count", "{}"),
            ("word_count", '{"key": ""}'),
            ("word_count", '{"key": "a", "other": 1}'),
            ("norm_guard", '{"min": 2, "max": 1}'),
            ("norm_guard", '{"min": true, "max": 1}'),
            ("project_keys", '{"keep": "a"}'),
            ("nope", "{}"),
        ):
            with self.subTest(function=function, params=params):
                with self.assertRaises(ValueError):
                    reference.parse_params(function, params)

    def test_a_log_of_several_collections_needs_one_named(self):
        lines = [
            '{"collection": "a", "id": "1", "operation": "add", "metadata": {"k": "v"}}',
            '{"collection": "b", "id": "1", "operation": "add", "metadata": {"k": "w"}}',
        ]
        with self.assertRaises(ValueError):
            reference.expected_outputs("project_keys", '{"keep": ["k"]}', lines)
        self.assertEqual(
            reference.expected_outputs("project_keys", '{"keep": ["k"]}', lines, collection="b"), {"1": {"k": "w"}}
        )


def random_log(rng, n):
    """A log of one collection over few ids, keys and values, so that every case of the
    fold (and every transition of the examples) comes up."""
    lines = []
    for _ in range(n):
        record = {"collection": "c", "id": "r%d" % rng.randrange(6), "operation": rng.choice(["add", "update", "upsert", "delete"])}
        if record["operation"] != "delete":
            if rng.random() < 0.7:
                dim = 2 if rng.random() < 0.95 else 3
                record["embedding"] = [rng.choice([0, 0.1, 0.5, 1, 1.5, 2, 3, -2]) for _ in range(dim)]
            if rng.random() < 0.8:
                record["metadata"] = {
                    k: rng.choice(["red", "blue", 1, 2, 1.0, 0.5, True, None])
                    for k in rng.sample(["genre", "year", "x"], rng.randrange(4))
                }
            if rng.random() < 0.7:
                record["document"] = " ".join(rng.choice(["a", "bb", "c"]) for _ in range(rng.randrange(5)))
        lines.append(json.dumps(record))
    return lines


class RandomLogs(unittest.TestCase):
    def test_the_deltas_of_every_change_end_at_the_outputs_of_random_logs(self):
        rng = random.Random(46)
        cases = (
            ("word_count", '{"key": "genre"}'),
            ("norm_guard", '{"min": 0.6, "max": 2}'),
            ("project_keys", '{"keep": ["genre", "x", "absent"]}'),
        )
        for i in range(300):
            lines = random_log(rng, rng.randrange(1, 40))
            changes = reference.changes_of(lines)
            for function, params in cases:
                expected = reference.expected_outputs(function, params, lines)
                got = folded(function, params, changes)
                if got != expected:
                    self.fail("log %d, %s: deltas give %r, the outputs are %r\n%s" % (i, function, got, expected, "\n".join(lines)))


if __name__ == "__main__":
    unittest.main()
