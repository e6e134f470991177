import pytest

import perfmodel as pm


@pytest.fixture(scope="session")
def a100():
    return pm.hardware("a100-80gb-sxm")


@pytest.fixture(scope="session")
def h100():
    return pm.hardware("h100-sxm")
