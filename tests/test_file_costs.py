"""The suite's order: longest recorded files first, each file kept whole and in its own order."""

from __future__ import annotations

from tests.file_costs import costs_from_junit, load, longest_first

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
 <testcase classname="tests.test_file_costs" name="a" time="1.5"/>
 <testcase classname="tests.test_file_costs" name="b" time="2.0"/>
 <testcase classname="tests.test_launched.TestGroup" name="c" time="4.25"/>
</testsuite></testsuites>
"""


def test_costs_sum_a_files_cases_and_name_the_file_of_a_class(tmp_path):
    (tmp_path / "suite.xml").write_text(JUNIT)
    assert costs_from_junit(tmp_path / "suite.xml") == {"tests/test_file_costs.py": 3.5,
                                                        "tests/test_launched.py": 4.2}


def test_longest_files_first_each_whole_and_unrecorded_ones_at_the_median():
    ids = ["tests/a.py::x", "tests/a.py::y", "tests/b.py::x", "tests/c.py::x", "tests/c.py::y", "tests/d.py::z"]
    costs = {"tests/a.py": 1.0, "tests/b.py": 9.0, "tests/c.py": 5.0}
    order = [ids[i] for i in longest_first(ids, costs)]
    assert order == ["tests/b.py::x", "tests/c.py::x", "tests/c.py::y", "tests/d.py::z", "tests/a.py::x",
                     "tests/a.py::y"]
    assert longest_first(ids, {}) == list(range(len(ids)))


def test_the_record_names_files_that_exist():
    from tests.file_costs import ROOT

    costs = load()
    assert costs, "tests/file_costs.json is missing (python -m tests.file_costs JUNIT_XML writes it)"
    assert all((ROOT / name).is_file() for name in costs), [n for n in costs if not (ROOT / n).is_file()]
