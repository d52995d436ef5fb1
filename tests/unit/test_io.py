"""Atomic outputs: all or nothing, with the permissions every other output has."""

import os
import stat

import pytest

from lara.io import atomic_output


def _umask():
    umask = os.umask(0)
    os.umask(umask)
    return umask


def test_a_directory_output_gets_the_usual_permissions_inside(tmp_path):
    out = tmp_path / "model"
    with atomic_output(out, directory=True) as tmp:
        (tmp / "model.safetensors").write_bytes(b"w")
        os.chmod(tmp / "model.safetensors", 0o600)  # as safetensors' own temporary file leaves it
        (tmp / "sub").mkdir(mode=0o700)
        (tmp / "sub" / "run.sh").write_text("#!/bin/sh\n")
        os.chmod(tmp / "sub" / "run.sh", 0o700)
    umask = _umask()
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask
    assert stat.S_IMODE((out / "model.safetensors").stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE((out / "sub").stat().st_mode) == 0o777 & ~umask
    assert stat.S_IMODE((out / "sub" / "run.sh").stat().st_mode) == 0o766 & ~umask  # its execute bit kept


def test_a_failed_write_leaves_nothing_and_keeps_the_old_output(tmp_path):
    out = tmp_path / "table.json"
    out.write_text("old")
    with pytest.raises(RuntimeError), atomic_output(out) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert out.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["table.json"]
    with pytest.raises(RuntimeError), atomic_output(tmp_path / "model", directory=True) as tmp:
        (tmp / "weights").write_bytes(b"half")
        raise RuntimeError("killed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.json"]
    with atomic_output(out) as tmp:
        tmp.write_text("new")
    assert out.read_text() == "new" and stat.S_IMODE(out.stat().st_mode) == 0o666 & ~_umask()


@pytest.mark.parametrize("signal_name, directory", [("SIGKILL", False), ("SIGTERM", False), ("SIGKILL", True)])
def test_the_temporaries_of_a_killed_writer_are_removed_by_the_next_write(tmp_path, signal_name, directory):
    """A writer killed inside atomic_output (no cleanup runs on SIGKILL, nor on an unhandled SIGTERM)
    leaves its .NAME.*.tmp beside the output; the next write of that output removes it."""
    import subprocess
    import sys
    import textwrap

    out = tmp_path / ("model" if directory else "table.parquet")
    child = textwrap.dedent(f"""
        import os, signal
        from lara.io import atomic_output
        with atomic_output({str(out)!r}, directory={directory}) as tmp:
            (tmp / "half").write_text("x") if {directory} else tmp.write_text("half")
            os.kill(os.getpid(), signal.{signal_name})
    """)
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
    assert proc.returncode < 0, proc.stderr  # killed by the signal
    left = list(tmp_path.glob(f".{out.name}.*.tmp"))
    assert len(left) == 1 and not out.exists()
    other = tmp_path / f".other.{out.name}.x.tmp"  # another output's temporary is not touched
    other.write_text("x")
    from lara.io import STARTED

    os.utime(left[0], (STARTED - 10, STARTED - 10))  # as if this process started after the killed one
    with atomic_output(out, directory=directory) as tmp:
        (tmp / "w").write_text("w") if directory else tmp.write_text("whole")
    assert not left[0].exists() and other.exists() and out.exists()
    assert list(tmp_path.glob(f".{out.name}.*.tmp")) == []


def test_a_path_s_hash_covers_names_and_contents_and_a_missing_path_is_refused(tmp_path):
    from lara.io import sha256_file, sha256_path

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "a.bin").write_bytes(b"a")
    assert sha256_path(tmp_path / "m" / "a.bin") == sha256_file(tmp_path / "m" / "a.bin")
    before = sha256_path(tmp_path / "m")
    (tmp_path / "m" / "a.bin").rename(tmp_path / "m" / "b.bin")  # same bytes, another name
    assert sha256_path(tmp_path / "m") != before
    # the hash of nothing would let a provenance record vouch for an input that is not there
    with pytest.raises(FileNotFoundError, match=r"gone: no such file or directory to hash"):
        sha256_path(tmp_path / "gone")
