"""How the suite hands its files to its worker processes (tests/conftest.py's FILES_SHARING) matches the fixtures
the files' tests ask for: a file that uses the browser or the shared app, unnamed there, would start its own on the
other worker; a file named there that no longer uses it would tie a worker for nothing."""
from __future__ import annotations

from tests.conftest import FILES_SHARING, sharing_unit


def test_every_file_that_shares_a_session_fixture_is_handed_out_with_the_others(request):
    """Over the files this run collected (the whole suite, as the README's command runs it)."""
    uses: dict[str, set] = {}
    for item in request.session.items:
        uses.setdefault(item.nodeid.split("::", 1)[0], set()).update(item.fixturenames)
    for file, fixtures in uses.items():
        wanted = next((fixture for fixture in FILES_SHARING if fixture in fixtures), file)
        assert sharing_unit(file) == wanted, (file, sorted(fixtures & set(FILES_SHARING)))
