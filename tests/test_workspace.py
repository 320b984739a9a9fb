"""A task's workspace keeps every path inside its folder; the artifact store takes plain
file names only."""

from __future__ import annotations

from pathlib import Path

import pytest

from relaygraph.agents.workspace import (
    MAX_WRITE_BYTES,
    Artifact,
    ArtifactStore,
    Workspace,
    WorkspaceEscapeError,
)
from relaygraph.errors import ToolInputError


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path / "task" / "workspace")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A secret file next to the workspace, which no workspace path may reach."""
    secret = tmp_path / "task" / "secret.txt"
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_text("top secret")
    return secret


# --- paths -------------------------------------------------------------------------------


def test_root_is_created_and_resolved(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    ws = Workspace(tmp_path / "link" / "ws")
    assert ws.root == tmp_path.resolve() / "real" / "ws"
    assert ws.root.is_dir()
    assert repr(ws) == f"Workspace({str(ws.root)!r})"


def test_relative_paths_resolve_inside(ws: Workspace) -> None:
    assert ws.resolve("a/b.txt") == ws.root / "a" / "b.txt"
    assert ws.resolve("a/../b.txt") == ws.root / "b.txt"
    assert ws.resolve("./c") == ws.root / "c"
    assert ws.resolve(".") == ws.root


def test_absolute_path_inside_is_accepted(ws: Workspace) -> None:
    assert ws.resolve(str(ws.root / "x.py")) == ws.root / "x.py"


@pytest.mark.parametrize("path", ["../x", "a/../../x", "..", "../workspace2/x"])
def test_dotdot_escapes_are_refused(ws: Workspace, path: str) -> None:
    with pytest.raises(WorkspaceEscapeError) as info:
        ws.resolve(path)
    message = str(info.value)
    assert repr(path) in message
    assert "uses '..' to leave the workspace" in message
    assert "relative to the task's workspace" in message
    assert info.value.path == path


def test_absolute_path_outside_is_refused(ws: Workspace) -> None:
    with pytest.raises(WorkspaceEscapeError, match="'/etc/passwd' is an absolute path outside"):
        ws.resolve("/etc/passwd")


def test_escape_error_is_a_tool_input_error(ws: Workspace) -> None:
    with pytest.raises(ToolInputError):
        ws.read_text("/etc/passwd")


def test_symlink_pointing_outside_is_refused(ws: Workspace, outside: Path) -> None:
    (ws.root / "link.txt").symlink_to(outside)
    (ws.root / "linkdir").symlink_to(outside.parent)

    for path in ("link.txt", "linkdir/secret.txt", "linkdir/new.txt"):
        with pytest.raises(WorkspaceEscapeError, match="symlink that leads outside"):
            ws.resolve(path)
    with pytest.raises(WorkspaceEscapeError):
        ws.read_text("link.txt")
    with pytest.raises(WorkspaceEscapeError):
        ws.write_text("link.txt", "overwritten")
    assert outside.read_text() == "top secret"


def test_dangling_symlink_pointing_outside_is_refused(ws: Workspace, tmp_path: Path) -> None:
    target = tmp_path / "created-outside.txt"
    (ws.root / "trap.txt").symlink_to(target)
    with pytest.raises(WorkspaceEscapeError):
        ws.write_text("trap.txt", "x")
    assert not target.exists()


def test_symlink_inside_is_followed(ws: Workspace) -> None:
    ws.write_text("real/data.txt", "hello")
    (ws.root / "alias").symlink_to(ws.root / "real")
    assert ws.resolve("alias/data.txt") == ws.root / "real" / "data.txt"
    assert ws.read_text("alias/data.txt") == "hello"


def test_symlink_loop_is_refused(ws: Workspace) -> None:
    (ws.root / "a").symlink_to(ws.root / "b")
    (ws.root / "b").symlink_to(ws.root / "a")
    with pytest.raises(WorkspaceEscapeError, match="'a' goes through a symlink loop"):
        ws.resolve("a")


@pytest.mark.parametrize(("path", "problem"), [("", "is empty"), ("  ", "is empty")])
def test_empty_path_is_refused(ws: Workspace, path: str, problem: str) -> None:
    with pytest.raises(WorkspaceEscapeError, match=problem):
        ws.resolve(path)


def test_nul_byte_is_refused(ws: Workspace) -> None:
    with pytest.raises(WorkspaceEscapeError, match=r"'a\\x00b' contains a NUL byte"):
        ws.resolve("a\x00b")


# --- writing -----------------------------------------------------------------------------


def test_write_creates_nested_folders(ws: Workspace) -> None:
    written = ws.write_text("src/pkg/mod.py", "print('hi')\n")
    assert written == ws.root / "src" / "pkg" / "mod.py"
    assert written.read_text() == "print('hi')\n"


def test_write_replaces_a_file(ws: Workspace) -> None:
    ws.write_text("a.txt", "first")
    ws.write_text("a.txt", "second")
    assert ws.read_text("a.txt") == "second"


def test_write_size_limit(tmp_path: Path) -> None:
    ws = Workspace(tmp_path, max_write_bytes=10)
    ws.write_text("ok.txt", "x" * 10)
    with pytest.raises(ToolInputError, match=r"'big.txt' is 11 bytes; the limit is 10 bytes"):
        ws.write_text("big.txt", "x" * 11)
    # UTF-8 bytes count, not characters.
    with pytest.raises(ToolInputError, match="is 12 bytes"):
        ws.write_text("big.txt", "é" * 6)
    assert not (tmp_path / "big.txt").exists()
    assert Workspace(tmp_path).max_write_bytes == MAX_WRITE_BYTES == 1_000_000


def test_write_to_a_folder_is_refused(ws: Workspace) -> None:
    (ws.root / "docs").mkdir()
    with pytest.raises(ToolInputError, match=r"'docs' is a folder.*'docs/notes.txt'"):
        ws.write_text("docs", "x")
    with pytest.raises(ToolInputError, match="is a folder"):
        ws.write_text(".", "x")


def test_write_under_a_file_is_refused(ws: Workspace) -> None:
    ws.write_text("a.txt", "x")
    with pytest.raises(ToolInputError, match=r"'a.txt/b.txt'.*existing file, not a folder"):
        ws.write_text("a.txt/b.txt", "y")


def test_write_refuses_invalid_unicode(ws: Workspace) -> None:
    with pytest.raises(ToolInputError, match="not valid Unicode text at index 2"):
        ws.write_text("a.txt", "ab\ud800")


# --- reading -----------------------------------------------------------------------------


def test_read_missing_file_lists_existing_files(ws: Workspace) -> None:
    ws.write_text("b.txt", "")
    ws.write_text("a/c.py", "")
    with pytest.raises(ToolInputError) as info:
        ws.read_text("nope.txt")
    assert str(info.value) == (
        "there is no file 'nope.txt' in the workspace. Files in the workspace: a/c.py, b.txt."
    )


def test_read_missing_file_lists_at_most_twenty(ws: Workspace) -> None:
    for i in range(25):
        ws.write_text(f"f{i:02}.txt", "")
    with pytest.raises(ToolInputError) as info:
        ws.read_text("nope.txt")
    message = str(info.value)
    assert "f19.txt and 5 more." in message
    assert "f20.txt" not in message


def test_read_missing_file_in_empty_workspace(ws: Workspace) -> None:
    with pytest.raises(ToolInputError, match="The workspace has no files yet"):
        ws.read_text("nope.txt")


def test_read_folder_is_refused(ws: Workspace) -> None:
    ws.write_text("d/x.txt", "")
    with pytest.raises(ToolInputError, match=r"'d' is a folder, not a file. Files in the"):
        ws.read_text("d")


def test_read_binary_is_refused(ws: Workspace) -> None:
    (ws.root / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(ToolInputError, match=r"'img.png' is not UTF-8 text"):
        ws.read_text("img.png")
    (ws.root / "nul.bin").write_bytes(b"abc\x00def")
    with pytest.raises(ToolInputError, match=r"'nul.bin' contains NUL bytes"):
        ws.read_text("nul.bin")


def test_read_truncates_long_files(ws: Workspace) -> None:
    ws.write_text("long.txt", "é" * 50)
    assert ws.read_text("long.txt", max_chars=50) == "é" * 50
    text = ws.read_text("long.txt", max_chars=10)
    assert text == "é" * 10 + "\n[truncated: showing the first 10 characters of 100 bytes]"


def test_list_files_is_sorted_relative_posix(ws: Workspace, outside: Path) -> None:
    ws.write_text("z.txt", "")
    ws.write_text("a/b/c.txt", "")
    ws.write_text("a/a.txt", "")
    (ws.root / "empty").mkdir()
    # A link to a folder outside is not walked into; a link to a file is listed by name.
    (ws.root / "outdir").symlink_to(outside.parent)
    (ws.root / "outfile").symlink_to(outside)
    assert ws.list_files() == ["a/a.txt", "a/b/c.txt", "outfile", "z.txt"]


# --- artifacts ---------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(tmp_path / "artifacts")


def test_artifact_store_root_is_created(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "x" / "artifacts")
    assert store.root.is_dir()
    assert repr(store) == f"ArtifactStore({str(store.root)!r})"


def test_save_returns_artifact(store: ArtifactStore) -> None:
    artifact = store.save("report.md", "# Résumé\n")
    assert artifact == Artifact(
        name="report.md", path=store.root / "report.md", size_bytes=len("# Résumé\n".encode())
    )
    assert artifact.path.read_text(encoding="utf-8") == "# Résumé\n"


@pytest.mark.parametrize(
    "name", ["report.md", "a", "A-b_c.1.txt", "_x", "-x", "x" * 100, "no_extension"]
)
def test_valid_artifact_names(store: ArtifactStore, name: str) -> None:
    assert store.save(name, "x").name == name


@pytest.mark.parametrize(
    "name",
    ["", ".hidden", ".", "..", "a/b.md", "../x.md", "/etc/passwd", "a b.md", "ü.md",
     "x" * 101, "a\\b", "a\x00b", "report.md\n"],
)  # fmt: skip
def test_invalid_artifact_names_are_refused(store: ArtifactStore, name: str) -> None:
    with pytest.raises(ToolInputError) as info:
        store.save(name, "x")
    assert repr(name) in str(info.value)
    assert "plain file name" in str(info.value)
    assert list(store.root.iterdir()) == []


def test_save_overwrites(store: ArtifactStore) -> None:
    store.save("r.md", "first version")
    artifact = store.save("r.md", "v2")
    assert artifact.size_bytes == 2
    assert store.list() == [artifact]
    assert artifact.path.read_text() == "v2"


def test_save_size_limit(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path, max_bytes=4)
    with pytest.raises(ToolInputError, match=r"artifact 'r.md' is 5 bytes; the limit is 4 bytes"):
        store.save("r.md", "12345")
    assert store.list() == []


def test_save_refuses_invalid_unicode(store: ArtifactStore) -> None:
    with pytest.raises(ToolInputError, match="not valid Unicode"):
        store.save("r.md", "\udc80")
    assert list(store.root.iterdir()) == []


def test_list_is_sorted_and_skips_other_entries(store: ArtifactStore) -> None:
    store.save("b.md", "bb")
    store.save("a.txt", "a")
    (store.root / ".b.md.1234.tmp").write_text("leftover")
    (store.root / "folder").mkdir()
    assert store.list() == [
        Artifact(name="a.txt", path=store.root / "a.txt", size_bytes=1),
        Artifact(name="b.md", path=store.root / "b.md", size_bytes=2),
    ]


def test_list_of_empty_store(store: ArtifactStore) -> None:
    assert store.list() == []
