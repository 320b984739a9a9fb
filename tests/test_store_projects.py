"""The ledger's projects, API keys and registered teams (``TenantRepository``,
``TeamRepository``), on SQLite and on PostgreSQL.

Every test that takes ``ledger`` or ``url`` runs on each backend (``tests/_store.py``).
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import pytest

from relaygraph.errors import ConfigError
from relaygraph.store import Ledger, RecordConflict, RecordNotFound
from tests._store import ORDERED_AGENTS, all_rows


def test_keys_are_stored_hashed_and_authenticate(ledger: Ledger, url: str) -> None:
    project, key = ledger.create_project("research")
    other, other_key = ledger.create_project("ops")
    assert key.startswith("rg_") and len(key) > 40 and key != other_key
    (record,) = ledger.api_keys(project.id)
    assert record.prefix == key[:10] and record.revoked_at is None

    rows = all_rows(url)
    assert hashlib.sha256(key.encode()).hexdigest() in rows
    assert not any(key in value or other_key in value for value in rows)
    if url.startswith("sqlite"):
        files = Path(url.removeprefix("sqlite:///")).parent.glob("ledger.sqlite*")
        assert not any(key.encode() in path.read_bytes() for path in files)

    assert ledger.authenticate(key) == project
    assert ledger.authenticate(other_key) == other
    assert ledger.authenticate(key[:-1]) is None
    assert ledger.authenticate("") is None
    assert ledger.authenticate(hashlib.sha256(key.encode()).hexdigest()) is None

    second, second_key = ledger.create_api_key(project.id)
    ledger.revoke_api_key(record.id)
    assert ledger.authenticate(key) is None
    assert ledger.authenticate(second_key) == project
    assert [k.id for k in ledger.api_keys(project.id)] == [record.id, second.id]


def test_project_names_are_unique_and_checked(ledger: Ledger) -> None:
    ledger.create_project("research")
    with pytest.raises(RecordConflict, match="project 'research': a project of that name exists"):
        ledger.create_project("research")
    with pytest.raises(ConfigError, match="'local'"):
        ledger.create_project("local")  # The CLI's built-in project.
    for bad in ["", "has space", "-dash", "x" * 65]:
        with pytest.raises(ConfigError, match=f"project name {bad!r} is invalid"):
            ledger.create_project(bad)
    with pytest.raises(RecordNotFound, match="no project 'ghost'"):
        ledger.create_api_key("ghost")


def test_registered_teams_are_versioned_per_project(ledger: Ledger) -> None:
    project, _ = ledger.create_project("research")
    other, _ = ledger.create_project("ops")
    first = {"agents": {"reviewer": {"description": "d", "prompt": "p"}}}
    one, created = ledger.register_team(
        project.id, "docs-review", definition=first, digest="sha256:1"
    )
    assert created and (one.name, one.version, one.definition) == ("docs-review", 1, first)
    # The same team again is no change; a changed one is the next version.
    again, created = ledger.register_team(
        project.id, "docs-review", definition=first, digest="sha256:1"
    )
    assert not created and again == one
    two, created = ledger.register_team(
        project.id, "docs-review", definition={"changed": True}, digest="sha256:2"
    )
    assert created and two.version == 2
    # Back to the first content is a change from the latest: version 3, not 1.
    three, _ = ledger.register_team(project.id, "docs-review", definition=first, digest="sha256:1")
    assert three.version == 3
    ledger.register_team(project.id, "alpha", definition={}, digest="sha256:a")
    # Another project's names are its own.
    theirs, _ = ledger.register_team(other.id, "docs-review", definition={}, digest="sha256:9")
    assert theirs.version == 1 and theirs.project_id == other.id

    assert ledger.team_version(project.id, "docs-review") == three
    assert ledger.team_version(project.id, "docs-review", 2) == two
    assert ledger.team_version(project.id, "docs-review", 4) is None
    assert ledger.team_version(other.id, "alpha") is None
    assert [v.version for v in ledger.team_versions(project.id, "docs-review")] == [1, 2, 3]
    assert [(t.name, t.version) for t in ledger.teams(project.id)] == [
        ("alpha", 1),
        ("docs-review", 3),
    ]
    assert [(t.name, t.version) for t in ledger.teams(other.id)] == [("docs-review", 1)]

    with pytest.raises(ConfigError, match="team name 'no space' is invalid"):
        ledger.register_team(project.id, "no space", definition={}, digest="sha256:x")
    with pytest.raises(ConfigError, match="definition"):
        ledger.register_team(project.id, "x", definition=[], digest="sha256:x")  # type: ignore[arg-type]
    with pytest.raises(RecordNotFound, match="project 'ghost'"):
        ledger.register_team("ghost", "x", definition={}, digest="sha256:x")


def test_a_registered_definition_reads_back_in_its_own_key_order(ledger: Ledger) -> None:
    """The agents' order is the team's (its digest, a swarm's first agent): the ledger keeps
    the definition as pushed, keys in their order, on every backend."""
    project, _ = ledger.create_project("research")
    ledger.register_team(
        project.id, "docs-review", definition=ORDERED_AGENTS, digest="sha256:ordered"
    )
    found = ledger.team_version(project.id, "docs-review")
    assert found is not None
    assert list(found.definition["agents"]) == ["researcher", "writer", "reviewer"]
    assert json.dumps(found.definition) == json.dumps(ORDERED_AGENTS)
    (listed,) = ledger.teams(project.id)
    assert list(listed.definition) == ["agents", "topology"]


def test_concurrent_pushes_number_versions_without_gaps(ledger: Ledger) -> None:
    project, _ = ledger.create_project("research")
    start = threading.Barrier(6)
    made: list[tuple[int, bool]] = []

    def push(n: int) -> None:
        start.wait()
        version, created = ledger.register_team(
            project.id, "t", definition={"n": n}, digest=f"sha256:{n}"
        )
        made.append((version.version, created))

    threads = [threading.Thread(target=push, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(version for version, _ in made) == [1, 2, 3, 4, 5, 6]
    assert [v.version for v in ledger.team_versions(project.id, "t")] == [1, 2, 3, 4, 5, 6]
