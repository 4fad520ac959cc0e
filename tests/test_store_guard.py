"""Tests without the clickhouse marker cannot reach the store."""

import pytest

from store import get_store


def test_unmarked_test_reaching_clickhouse_fails():
    with pytest.raises(AssertionError, match="mark it with @pytest.mark.clickhouse"):
        get_store().query("SELECT 1", tag="tests.unmarked")


@pytest.mark.clickhouse
def test_marked_test_gets_the_real_store():
    assert get_store().query("SELECT 1 AS one", tag="tests.marked").scalar() == 1
