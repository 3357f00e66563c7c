"""`edge-infer bench archive create SRC DST | verify DST | restore DST OUT`.

An archive is a directory:

    DST/MANIFEST.json      one entry per file: path, size, SHA-256, mode,
                           and the size and SHA-256 of what is stored
    DST/data/PATH          files up to the compression threshold, as they are
    DST/gzip/PATH.gz       larger files, gzip-compressed (restored byte-exact)

Plain and compressed files live under separate roots so no stored name can
collide with another. Symlinks and anything that is not a regular file are
refused on create (a link could point outside SRC); on verify and restore,
manifest paths must stay inside the archive and the output, and a symlink
found in the archive is an error. Empty directories are not kept.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import stat
import sys
import zlib
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Literal

from pydantic import BaseModel, ValidationError

from edge_infer.bench.harness.provenance import now_utc

MANIFEST = "MANIFEST.json"
DATA_DIR = "data"
GZIP_DIR = "gzip"
MIB = 1024 * 1024
DEFAULT_COMPRESS_ABOVE_MIB = 50.0
CHUNK = MIB


class ArchiveError(RuntimeError):
    pass


class ManifestEntry(BaseModel):
    path: str  # POSIX path relative to SRC
    bytes: int
    sha256: str
    mode: int  # permission bits
    gzip: bool
    stored_bytes: int
    stored_sha256: str

    def stored(self) -> str:
        return f"{GZIP_DIR}/{self.path}.gz" if self.gzip else f"{DATA_DIR}/{self.path}"


class Manifest(BaseModel):
    kind: Literal["edge-infer.bench.archive"] = "edge-infer.bench.archive"
    version: int = 1
    created_at: str
    compress_above_bytes: int
    files: list[ManifestEntry]


def safe_relpath(path: str) -> PurePosixPath:
    """A relative path with no '..', '.', empty or absolute parts; ArchiveError otherwise."""
    p = PurePosixPath(path)
    if not path or p.is_absolute() or "\\" in path or "\0" in path or any(part in ("..", ".", "") for part in path.split("/")):
        raise ArchiveError(f"unsafe path {path!r} in manifest: paths must be relative and stay inside the archive")
    return p


def _copy_hashing(src: BinaryIO, dst: BinaryIO | None) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    while chunk := src.read(CHUNK):
        digest.update(chunk)
        size += len(chunk)
        if dst is not None:
            dst.write(chunk)
    return size, digest.hexdigest()


def _hash_file(path: Path) -> tuple[int, str]:
    with open(path, "rb") as f:
        return _copy_hashing(f, None)


def _source_files(src: Path) -> list[tuple[str, Path]]:
    """Every regular file under SRC as (posix relative path, path); refuses links and special files."""
    found: list[tuple[str, Path]] = []
    for root, dirs, files in os.walk(src, followlinks=False):
        for name in sorted(dirs + files):
            path = Path(root) / name
            rel = path.relative_to(src).as_posix()
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise ArchiveError(
                    f"{rel} is a symlink (-> {os.readlink(path)}); archives hold regular files only: "
                    "replace the link with the file it points to, or remove it"
                )
            if name in files and not stat.S_ISREG(mode):
                raise ArchiveError(f"{rel} is not a regular file (a socket, FIFO or device); remove it from {src}")
            if name in files:
                found.append((rel, path))
        dirs.sort()
    return sorted(found)


def _empty_or_absent(path: Path, role: str) -> None:
    if path.is_symlink() or (path.exists() and (not path.is_dir() or any(path.iterdir()))):
        raise ArchiveError(f"{role} {path} already exists and is not an empty directory; choose a new path")


def create_archive(src: Path, dst: Path, compress_above_bytes: int) -> Manifest:
    if src.is_symlink() or not src.is_dir():
        raise ArchiveError(f"source {src} is not a directory (symlinks are not followed)")
    _empty_or_absent(dst, "destination")
    if dst.resolve().is_relative_to(src.resolve()):
        raise ArchiveError(f"destination {dst} is inside the source {src}; put the archive elsewhere")
    sources = _source_files(src)  # all checks pass before anything is written
    entries = []
    for rel, path in sources:
        compress = path.stat().st_size > compress_above_bytes
        entry_stub = ManifestEntry(path=rel, bytes=0, sha256="", mode=0, gzip=compress, stored_bytes=0, stored_sha256="")
        target = dst / entry_stub.stored()
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "rb") as f, open(target, "xb") as out:
            if compress:
                # mtime=0 and no file name: the same input gives the same archive bytes.
                with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0) as gz:
                    size, digest = _copy_hashing(f, gz)  # type: ignore[arg-type]
            else:
                size, digest = _copy_hashing(f, out)
        stored_size, stored_digest = _hash_file(target)
        entries.append(entry_stub.model_copy(update=dict(
            bytes=size, sha256=digest, mode=stat.S_IMODE(path.stat().st_mode) & 0o777,
            stored_bytes=stored_size, stored_sha256=stored_digest,
        )))
    manifest = Manifest(created_at=now_utc(), compress_above_bytes=compress_above_bytes, files=entries)
    tmp = dst / (MANIFEST + ".tmp")
    tmp.write_text(manifest.model_dump_json(indent=2) + "\n")
    tmp.rename(dst / MANIFEST)
    return manifest


def load_manifest(dst: Path) -> Manifest:
    path = dst / MANIFEST
    if path.is_symlink() or not path.is_file():
        raise ArchiveError(f"{dst} has no {MANIFEST}; is it an archive made by `edge-infer bench archive create`?")
    try:
        manifest = Manifest.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        raise ArchiveError(f"{path} is not a valid manifest: {exc.errors()[0]['msg']}") from None
    for entry in manifest.files:
        safe_relpath(entry.path)
    return manifest


def _check_entry(dst: Path, entry: ManifestEntry) -> str | None:
    where = f"{entry.path} (stored as {entry.stored()})"
    stored = dst / entry.stored()
    if stored.is_symlink():
        return f"symlink: {where} is a symlink; archives hold regular files only"
    if not stored.is_file():
        return f"missing: {where}"
    size, digest = _hash_file(stored)
    if size != entry.stored_bytes or digest != entry.stored_sha256:
        return f"changed: {where}: stored bytes differ from the manifest"
    if entry.gzip:
        try:
            with gzip.open(stored, "rb") as f:
                size, digest = _copy_hashing(f, None)  # type: ignore[arg-type]
        except (OSError, EOFError, zlib.error) as exc:
            return f"corrupt: {where}: {exc}"
    if size != entry.bytes or digest != entry.sha256:
        return f"changed: {where}: content differs from the original recorded in the manifest"
    return None


def verify_archive(dst: Path) -> list[str]:
    """Problems found, each naming a file; empty when the archive is intact."""
    manifest = load_manifest(dst)
    problems = [p for e in manifest.files if (p := _check_entry(dst, e))]
    expected = {e.stored() for e in manifest.files} | {MANIFEST}
    for root, dirs, files in os.walk(dst, followlinks=False):
        for name in sorted(dirs + files):
            path = Path(root) / name
            rel = path.relative_to(dst).as_posix()
            if path.is_symlink() and rel not in expected:
                problems.append(f"symlink: {rel} is a symlink; archives hold regular files only")
            elif name in files and rel not in expected:
                problems.append(f"extra: {rel} is not in the manifest")
    return problems


def restore_archive(dst: Path, out: Path) -> Manifest:
    problems = verify_archive(dst)
    if problems:
        raise ArchiveError(f"refusing to restore {dst}: it fails verification:\n  " + "\n  ".join(problems))
    _empty_or_absent(out, "output")
    manifest = load_manifest(dst)
    out.mkdir(parents=True, exist_ok=True)
    root = out.resolve()
    for entry in manifest.files:
        target = out / safe_relpath(entry.path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.parent.resolve().is_relative_to(root):
            raise ArchiveError(f"{entry.path} would be restored outside {out}; refusing")
        # O_EXCL | O_NOFOLLOW: never write through a link planted in the output.
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        opener = gzip.open if entry.gzip else open
        with opener(dst / entry.stored(), "rb") as f, os.fdopen(fd, "wb") as w:  # type: ignore[operator]
            size, digest = _copy_hashing(f, w)
        if size != entry.bytes or digest != entry.sha256:
            target.unlink()
            raise ArchiveError(f"{entry.path} changed while being restored (SHA-256 mismatch); verify the archive again")
        os.chmod(target, entry.mode & 0o777)
    return manifest


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="archive_action", metavar="ACTION", required=True)
    create = sub.add_parser("create", help="archive the directory SRC into the new directory DST")
    create.add_argument("src", type=Path, metavar="SRC")
    create.add_argument("dst", type=Path, metavar="DST")
    create.add_argument("--compress-above-mib", type=float, default=DEFAULT_COMPRESS_ABOVE_MIB,
                        help=f"gzip files larger than this many MiB (default {DEFAULT_COMPRESS_ABOVE_MIB:g})")
    verify = sub.add_parser("verify", help="check every file of DST against its manifest")
    verify.add_argument("dst", type=Path, metavar="DST")
    restore = sub.add_parser("restore", help="verify DST, then restore its files into the new directory OUT")
    restore.add_argument("dst", type=Path, metavar="DST")
    restore.add_argument("out", type=Path, metavar="OUT")


def _mib(n: int) -> str:
    return f"{n / MIB:.1f} MiB"


def run(args: argparse.Namespace) -> int:
    try:
        if args.archive_action == "create":
            m = create_archive(args.src, args.dst, int(args.compress_above_mib * MIB))
            original = sum(e.bytes for e in m.files)
            stored = sum(e.stored_bytes for e in m.files)
            print(f"archived {len(m.files)} files ({_mib(original)}; stored {_mib(stored)}, "
                  f"{sum(e.gzip for e in m.files)} gzip-compressed) into {args.dst}")
        elif args.archive_action == "verify":
            problems = verify_archive(args.dst)
            if problems:
                print(f"{args.dst}: {len(problems)} problem(s):\n  " + "\n  ".join(problems), file=sys.stderr)
                return 1
            m = load_manifest(args.dst)
            print(f"{args.dst}: verified {len(m.files)} files against {MANIFEST}")
        else:
            m = restore_archive(args.dst, args.out)
            print(f"restored {len(m.files)} files from {args.dst} into {args.out}")
    except ArchiveError as exc:
        print(f"edge-infer bench archive {args.archive_action}: {exc}", file=sys.stderr)
        return 1
    return 0
