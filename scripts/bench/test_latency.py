#!/usr/bin/env python3
"""Tests of latency.py: a synthetic JSON log and kcat timestamp file, checking that each
record is matched to the batch that committed it and that --warmup-ms leaves out exactly
the records stamped in the first W ms (and keeps them in whole_run).

Run: python3 -m unittest discover -s scripts/bench -p 'test_*.py'
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
T0 = 1_800_000_000_000  # ms


def iso(ms):
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def commit_line(topic, partition, start, end, at_ms):
    span = {"topic": topic, "partition": partition, "from": start, "to": end, "records": end - start, "name": "batch"}
    return json.dumps({"timestamp": iso(at_ms), "level": "DEBUG", "fields": {"message": "batch committed"},
                       "span": span, "spans": [span]})


class LatencyTest(unittest.TestCase):
    def run_latency(self, warmup_ms):
        with tempfile.TemporaryDirectory() as d:
            log, ts = os.path.join(d, "log"), os.path.join(d, "ts")
            # partition 0: offsets 0-9 stamped at T0 + 0..900 ms (the warm-up), committed
            # 500 ms after the last; offsets 10-19 stamped at T0 + 1000..1900, committed
            # 20 ms after the last. Partition 1: one late batch of a steady record.
            with open(log, "w") as f:
                f.write(json.dumps({"timestamp": iso(T0), "level": "INFO", "fields": {"message": "partition starts"}}) + "\n")
                f.write(commit_line("t.log", 0, 0, 10, T0 + 900 + 500) + "\n")
                f.write(commit_line("other.log", 0, 10, 20, T0) + "\n")  # another topic: ignored
                f.write(commit_line("t.log", 0, 10, 20, T0 + 1900 + 20) + "\n")
                f.write(commit_line("t.log", 1, 0, 1, T0 + 1500 + 300) + "\n")
            with open(ts, "w") as f:
                for o in range(20):
                    f.write(f"0 {o} {T0 + 100 * o}\n")
                f.write(f"1 0 {T0 + 1500}\n")
            out = subprocess.run([sys.executable, os.path.join(HERE, "latency.py"), "--log", log, "--timestamps", ts,
                                  "--topic", "t.log", "--warmup-ms", str(warmup_ms)],
                                 capture_output=True, text=True, check=True).stdout
            return json.loads(out)

    def test_every_record_is_matched_to_its_batch(self):
        r = self.run_latency(0)
        self.assertEqual(r["unmatched"], 0)
        self.assertEqual(r["n"], 21)
        self.assertEqual(r["whole_run"]["n"], 21)
        # partition 0's first batch: 1400 ms for offset 0 down to 500 ms for offset 9
        self.assertEqual(r["max_ms"], 1400.0)

    def test_the_warmup_is_left_out_and_kept_in_whole_run(self):
        r = self.run_latency(1000)
        self.assertEqual(r["n"], 11)  # offsets 10-19 of partition 0 and partition 1's record
        self.assertEqual(r["max_ms"], 920.0)  # offset 10: stamped at 1000, committed at 1920
        self.assertEqual(r["whole_run"]["n"], 21)
        self.assertEqual(r["whole_run"]["max_ms"], 1400.0)
        self.assertEqual(r["warmup_ms"], 1000.0)


if __name__ == "__main__":
    unittest.main()
