"""Files that outlive their writer: written whole or not at all, JSON without a silent default."""

import hashlib
import json

import pytest

from device.files import atomic_writer, sha256_file, write_atomic, write_json_atomic


def test_a_write_that_dies_half_way_leaves_the_previous_file_and_no_temporary(tmp_path):
    path = tmp_path / "entry.json"
    write_json_atomic(path, {"p50_ms": 1.0})
    with pytest.raises(RuntimeError):
        with atomic_writer(path, text=True) as handle:
            handle.write('{"p50_ms": 2')  # half a document, then the writer dies (a kill is the same to the reader)
            raise RuntimeError("killed mid-write")
    assert json.loads(path.read_text()) == {"p50_ms": 1.0}
    assert list(tmp_path.iterdir()) == [path]


def test_a_value_json_cannot_hold_fails_before_anything_is_replaced(tmp_path):
    path = tmp_path / "result.json"
    write_json_atomic(path, {"runs": []})
    with pytest.raises(TypeError, match="not JSON serializable"):  # default=str stored "<object object at 0x…>"
        write_json_atomic(path, {"runs": [object()]})
    assert json.loads(path.read_text()) == {"runs": []} and list(tmp_path.iterdir()) == [path]


def test_written_files_get_ordinary_permissions_and_hash_as_their_bytes(tmp_path):
    path = write_atomic(tmp_path / "report.md", "# report\n")
    assert path.read_text() == "# report\n"
    plain = tmp_path / "plain.md"
    plain.write_text("x")
    assert path.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777, "the umask's permissions, not mkstemp's 0600"
    assert sha256_file(path) == hashlib.sha256(b"# report\n").hexdigest()
