from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("hardware", "models")   # folders of data the package ships: tests never write there


def shipped_files() -> set[str]:
    """Every file under the shipped data folders, as paths relative to the checkout."""
    return {p.relative_to(ROOT).as_posix() for folder in SHIPPED
            for p in (ROOT / folder).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="session", autouse=True)
def shipped_folders_untouched():
    """Fail the session when a test added or removed a file in hardware/ or models/ (a
    command run with an output path inside the checkout: use tmp_path)."""
    before = shipped_files()
    yield
    after = shipped_files()
    added, removed = sorted(after - before), sorted(before - after)
    if added or removed:
        pytest.fail(f"the tests changed the shipped folders {', '.join(SHIPPED)}: added "
                    f"{added or 'nothing'}, removed {removed or 'nothing'}; write outputs "
                    "under tmp_path", pytrace=False)


@pytest.fixture(scope="session")
def a100():
    from tests.datasheet import datasheet

    return datasheet("a100-80gb-sxm")


@pytest.fixture(scope="session")
def h100():
    from tests.datasheet import datasheet

    return datasheet("h100-sxm")
