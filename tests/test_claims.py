"""Claims against evidence, and the test counts a runner's summary gives (subtask/claims.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from subtask.model import claims
from subtask.model.claims import Counts
from subtask.model.job import VerifyResult


def test_counts_read_from_a_real_pytest_run(tmp_path):
    (tmp_path / "test_x.py").write_text("def test_a():\n    assert 1\ndef test_b():\n    assert 0\n"
                                        "def test_c():\n    assert 1\n")
    for flags in (["-q"], []):
        run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *flags, "test_x.py"],
                             cwd=tmp_path, capture_output=True, text=True, check=False)
        assert claims.test_counts(run.stdout) == Counts(2, 1)


def test_counts_read_from_a_real_unittest_run(tmp_path):
    (tmp_path / "t_u.py").write_text("import unittest\nclass T(unittest.TestCase):\n    def test_a(self): pass\n"
                                     "    def test_b(self): self.fail()\n    @unittest.skip('x')\n"
                                     "    def test_c(self): pass\n    def test_d(self): pass\n")
    run = subprocess.run([sys.executable, "-m", "unittest", "t_u"], cwd=tmp_path, capture_output=True, text=True,
                         check=False)
    assert claims.test_counts(run.stderr) == Counts(2, 1)


@pytest.mark.parametrize("output, counts", [
    ("failures:\n    tests::b\n\ntest result: FAILED. 1 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; "
     "finished in 0.14s\n\ntest result: ok. 4 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out\n", Counts(5, 1)),
    ("Test Suites: 1 failed, 1 total\nTests:       1 failed, 2 passed, 3 total\nSnapshots:   0 total\n", Counts(2, 1)),
    (" Test Files  1 failed (1)\n      Tests  1 failed | 2 passed (3)\n   Start at  10:00:00\n", Counts(2, 1)),
    ("=== RUN   TestA\n--- PASS: TestA (0.00s)\n=== RUN   TestB\n    x_test.go:8: boom\n--- FAIL: TestB (0.00s)\n"
     "FAIL\nFAIL\texample.com/x\t0.002s\n", Counts(1, 1)),
    ("sh: 1: make: not found\n", None),
    ("", None),
])
def test_counts_of_each_runners_summary(output, counts):
    assert claims.test_counts(output) == counts


def _verify(passed: bool, exit_code: int = 1) -> VerifyResult:
    return VerifyResult(command="pytest -q", exit_code=0 if passed else exit_code, seconds=1.0, head="a" * 40,
                        tree="b" * 40, passed=passed)


def test_a_claim_that_tests_pass_is_contradicted_by_a_failed_verify():
    found = claims.contradictions("Fixed the parser.\nAll tests pass now.\nSTATUS: done", verify=_verify(False),
                                  checks_failed=[], files=["src/parser.py"], files_complete=True, watch=None)
    assert found == [{"claim": "All tests pass", "against": "verify failed (exit 1)"}]
    assert claims.line(found) == '"All tests pass" — verify failed (exit 1)'


def test_a_claim_that_a_passed_verify_holds_up_is_not_reported():
    assert claims.contradictions("All tests pass.", verify=_verify(True), checks_failed=[], files=[],
                                 files_complete=True, watch=None) == []


def test_a_pass_with_a_failed_check_contradicts_the_claim():
    found = claims.contradictions("The test suite passes.", verify=_verify(True), checks_failed=["no-suppression"],
                                  files=[], files_complete=True, watch=None)
    assert found == [{"claim": "test suite passes", "against": "check no-suppression failed"}]


def test_without_verify_the_order_of_edits_and_test_runs_decides():
    watch = claims.Watch()
    for event in ({"type": "tool", "name": "Edit"}, {"type": "command", "command": "pytest -q", "exit": 0},
                  {"type": "tool", "name": "Write"}, {"type": "text", "text": "done"}):
        watch.see(event)
    found = claims.contradictions("Tests pass.", verify=None, checks_failed=[], files=[], files_complete=True,
                                  watch=watch.to_dict())
    assert found == [{"claim": "Tests pass",
                      "against": "no verify ran, and its last test command ran before its last edit"}]
    watch.see({"type": "command", "command": "python -m pytest", "exit": 0})
    assert claims.contradictions("Tests pass.", verify=None, checks_failed=[], files=[], files_complete=True,
                                 watch=watch.to_dict()) == []
    assert claims.contradictions("All 12 tests passed.", verify=None, checks_failed=[], files=[], files_complete=True,
                                 watch=None) == [{"claim": "All 12 tests passed",
                                                  "against": "no verify ran, and no test command was seen"}]


@pytest.mark.parametrize("summary", ["The tests do not pass yet.", "Not all tests pass.", "Some tests still fail.",
                                     "I could not make the tests pass.", "Wrote the docs.\nSTATUS: done"])
def test_no_claim_is_read_into_a_summary_that_makes_none(summary):
    assert claims.test_claim(summary) is None


def test_files_named_as_changed_but_absent_from_the_diff_are_reported():
    summary = "Updated `src/app.py` and tests/test_app.py to handle empty input.\nSee README for details."
    found = claims.contradictions(summary, verify=_verify(True), checks_failed=[], files=["src/app.py"],
                                  files_complete=True, watch=None)
    assert found == [{"claim": "changed tests/test_app.py", "against": "not in the diff"}]
    # a file named by its base name matches its path in the diff
    assert claims.contradictions("Fixed app.py.", verify=_verify(True), checks_failed=[], files=["src/app.py"],
                                 files_complete=True, watch=None) == []
    # a diff listed only in part says nothing about what is absent
    assert claims.contradictions(summary, verify=_verify(True), checks_failed=[], files=[], files_complete=False,
                                 watch=None) == []
