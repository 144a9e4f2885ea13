"""The order `make test` hands test groups to its workers (tests/conftest.py)."""

from tests.conftest import run_order


def test_long_groups_first_then_labs_then_unit_tests_each_by_size():
    groups = {"unit/test_a.py": 40, "unit/test_b.py": 1, "unit/test_c.py": 2, "integration/test_x.py": 2,
              "conformance/test_y.py": 9, "e2e/test_z.py": 3, "net42": 6, "lab33": 21,
              "e2e/test_kills_create_engine.py": 2, "e2e/test_kills_delete_engine.py": 1, "unit/test_d.py": 5,
              "unit/test_e.py": 3}
    assert run_order(groups) == [
        "e2e/test_kills_create_engine.py", "e2e/test_kills_delete_engine.py", "lab33",
        # the smallest unit modules, behind a first group of at most two tests
        "unit/test_b.py", "unit/test_c.py", "unit/test_e.py",
        "net42", "e2e/test_z.py", "integration/test_x.py", "conformance/test_y.py",
        "unit/test_a.py", "unit/test_d.py"]
