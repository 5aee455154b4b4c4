#!/usr/bin/env python3
"""tests/check_gtest_suites.py: every GoogleTest suite is declared one way in its file.

GoogleTest fails, at run time only, a test whose suite mixes TEST with TEST_F (or TEST_P) of
a fixture: "All tests in the same test suite must use the same test fixture class". The gpu
tests run only on a lent GPU, so such a mix there is found a session late (issue 19:
NcclTimeout was a TEST_F fixture and PeerNeverJoins a TEST of the same suite; it failed on
the H200 while every CPU build passed, since test_nccl_comm exits 77 without a device).

`check_gtest_suites.py PATH...` (files, or folders searched for *.cpp) prints one line per
suite declared with more than one kind of macro in a file, `file:line: ...`, and exits 1 if
there is any. TEST is one kind; TEST_F, TEST_P, TYPED_TEST and TYPED_TEST_P each name the
fixture class. `--self-test` first checks the rule on known-bad and known-good snippets.
Standard library only.
"""
import os
import re
import sys

MACRO = re.compile(r"^\s*(TEST|TEST_F|TEST_P|TYPED_TEST|TYPED_TEST_P)\s*\(\s*(\w+)\s*,\s*(\w+)",
                   re.MULTILINE)


def findings(text, path):
    """Lines `path:line: ...` for each suite of `text` declared with two kinds of macro."""
    first = {}  # suite -> (kind, line, test)
    out = []
    for m in MACRO.finditer(text):
        kind, suite, test = m.group(1), m.group(2), m.group(3)
        line = text.count("\n", 0, m.start()) + 1
        if suite not in first:
            first[suite] = (kind, line, test)
            continue
        kind0, line0, test0 = first[suite]
        if kind != kind0:
            out.append(f"{path}:{line}: {kind}({suite}, {test}) but {kind0}({suite}, {test0}) at "
                       f"line {line0}: GoogleTest fails every test of a suite that mixes them")
    return out


def self_test():
    bad = "class A : public testing::Test {};\nTEST_F(A, x) {}\nTEST(A, y) {}\n"
    good = "TEST_F(A, x) {}\nTEST_F(A, y) {}\nTEST(B, z) {}\n  TEST(B, w) {}\n"
    found = findings(bad, "bad")
    assert len(found) == 1 and "bad:3:" in found[0], found
    assert findings(good, "good") == [], findings(good, "good")
    assert len(findings("TEST_P(P, a) {}\nTEST(P, b) {}\n", "p")) == 1


def main(argv):
    args = argv[1:]
    if args and args[0] == "--self-test":
        self_test()
        args = args[1:]
    files = []
    for a in args:
        if os.path.isdir(a):
            for root, _, names in os.walk(a):
                files += [os.path.join(root, n) for n in sorted(names) if n.endswith(".cpp")]
        else:
            files.append(a)
    if not files:
        print("check_gtest_suites.py: no .cpp files given", file=sys.stderr)
        return 2
    out = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            out += findings(fh.read(), f)
    for line in out:
        print(line)
    print(f"check_gtest_suites.py: {len(files)} files, {len(out)} mixed suite(s)", file=sys.stderr)
    return 1 if out else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
