from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from edge_infer.bench.harness.archive import MANIFEST
from edge_infer.cli import main

THRESHOLD_MIB = "0.001"  # ~1 KiB, so the test's "large" file is compressed


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "results"
    (src / "runs" / "a").mkdir(parents=True)
    (src / "summary.json").write_text('{"tg_tps": 12.5}\n')
    (src / "runs" / "a" / "trace.jsonl").write_text("".join(f'{{"step": {i}, "ms": 1.25}}\n' for i in range(2000)))
    (src / "runs" / "a" / "blob.bin").write_bytes(bytes(range(256)) * 16)
    script = src / "rerun.sh"
    script.write_text("#!/bin/sh\necho rerun\n")
    script.chmod(0o755)
    return src


def archive(*args: str) -> int:
    return main(["bench", "archive", *map(str, args)])


def tree(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mode & 0o777)
        for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_round_trip_is_byte_exact_and_compresses_large_files(tmp_path, source):
    dst, out = tmp_path / "archive", tmp_path / "restored"
    assert archive("create", source, dst, "--compress-above-mib", THRESHOLD_MIB) == 0
    manifest = json.loads((dst / MANIFEST).read_text())
    entries = {e["path"]: e for e in manifest["files"]}
    assert set(entries) == {"summary.json", "rerun.sh", "runs/a/trace.jsonl", "runs/a/blob.bin"}
    trace = entries["runs/a/trace.jsonl"]
    assert trace["gzip"] and trace["stored_bytes"] < trace["bytes"]
    assert (dst / "gzip" / "runs" / "a" / "trace.jsonl.gz").is_file()
    assert not entries["summary.json"]["gzip"]
    assert archive("verify", dst) == 0
    assert archive("restore", dst, out) == 0
    assert tree(out) == tree(source)


def test_same_input_gives_the_same_stored_bytes(tmp_path, source):
    archive("create", source, tmp_path / "one", "--compress-above-mib", THRESHOLD_MIB)
    archive("create", source, tmp_path / "two", "--compress-above-mib", THRESHOLD_MIB)
    assert tree(tmp_path / "one" / "gzip") == tree(tmp_path / "two" / "gzip")


@pytest.mark.parametrize(
    "tamper, expected",
    [
        (lambda dst: (dst / "data" / "summary.json").write_text('{"tg_tps": 99.9}\n'), "changed: summary.json"),
        (lambda dst: (dst / "gzip" / "runs" / "a" / "trace.jsonl.gz").unlink(), "missing: runs/a/trace.jsonl"),
        (lambda dst: (dst / "data" / "planted.txt").write_text("x"), "extra: data/planted.txt"),
    ],
)
def test_verify_names_the_tampered_file(tmp_path, source, capsys, tamper, expected):
    dst = tmp_path / "archive"
    archive("create", source, dst, "--compress-above-mib", THRESHOLD_MIB)
    tamper(dst)
    assert archive("verify", dst) == 1
    assert expected in capsys.readouterr().err
    assert archive("restore", dst, tmp_path / "out") == 1
    assert not (tmp_path / "out").exists()


def test_recompressed_content_change_is_detected(tmp_path, source, capsys):
    """A stored gzip replaced together with its stored hash still fails on the original hash."""
    import gzip
    import hashlib

    dst = tmp_path / "archive"
    archive("create", source, dst, "--compress-above-mib", THRESHOLD_MIB)
    stored = dst / "gzip" / "runs" / "a" / "trace.jsonl.gz"
    stored.write_bytes(gzip.compress(b"forged\n"))
    manifest = json.loads((dst / MANIFEST).read_text())
    for e in manifest["files"]:
        if e["path"] == "runs/a/trace.jsonl":
            e["stored_bytes"], e["stored_sha256"] = stored.stat().st_size, hashlib.sha256(stored.read_bytes()).hexdigest()
    (dst / MANIFEST).write_text(json.dumps(manifest))
    assert archive("verify", dst) == 1
    assert "changed: runs/a/trace.jsonl" in capsys.readouterr().err


def test_symlinks_in_the_source_are_refused(tmp_path, source, capsys):
    outside = tmp_path / "secret.txt"
    outside.write_text("not part of the results")
    os.symlink(outside, source / "runs" / "link.txt")
    assert archive("create", source, tmp_path / "archive") == 1
    assert "runs/link.txt is a symlink" in capsys.readouterr().err
    assert not (tmp_path / "archive").exists()


def test_symlinked_directory_in_the_source_is_refused(tmp_path, source, capsys):
    os.symlink(tmp_path, source / "escape", target_is_directory=True)
    assert archive("create", source, tmp_path / "archive") == 1
    assert "escape is a symlink" in capsys.readouterr().err


def test_symlink_planted_in_an_archive_is_refused(tmp_path, source, capsys):
    dst = tmp_path / "archive"
    archive("create", source, dst)
    stored = dst / "data" / "summary.json"
    stored.unlink()
    os.symlink(tmp_path / "secret", stored)
    assert archive("restore", dst, tmp_path / "out") == 1
    assert "symlink: summary.json" in capsys.readouterr().err


@pytest.mark.parametrize("bad_path", ["../escaped.txt", "/etc/escaped.txt", "runs/../../escaped.txt"])
def test_manifest_paths_escaping_the_archive_are_refused(tmp_path, source, capsys, bad_path):
    dst = tmp_path / "archive"
    archive("create", source, dst)
    manifest = json.loads((dst / MANIFEST).read_text())
    manifest["files"][0]["path"] = bad_path
    (dst / MANIFEST).write_text(json.dumps(manifest))
    assert archive("verify", dst) == 1
    assert archive("restore", dst, tmp_path / "out" / "inner") == 1
    assert "unsafe path" in capsys.readouterr().err
    assert not (tmp_path / "out" / "escaped.txt").exists() and not (tmp_path / "escaped.txt").exists()


def test_create_and_restore_refuse_non_empty_targets(tmp_path, source, capsys):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("keep")
    assert archive("create", source, taken) == 1
    dst = tmp_path / "archive"
    assert archive("create", source, dst) == 0
    assert archive("restore", dst, taken) == 1
    assert "not an empty directory" in capsys.readouterr().err
    assert archive("create", source, source / "inside") == 1
