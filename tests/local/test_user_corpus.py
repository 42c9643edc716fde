"""`source: file` corpora cannot go wrong silently: archives (zip, gzip, xz, bz2) are recognised by their magic bytes
and unpacked to the same splits as the plain text; a zip of several files, a tar or a zstd file is refused; a
binary file gets a warning stating its non-text fraction; an MD5 mismatch names the key and both MD5s; a damaged
or truncated split is refused before training, naming the file and what to delete."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import logging
import lzma
import random
import zipfile
from pathlib import Path

import pytest

from gradfidelity.errors import UserError
from gradfidelity.studies.local import data
from tests.local._config import corpus

REPO = Path(__file__).resolve().parents[2]


def _text() -> bytes:
    """About 60 KB of UTF-8 text with accents and other multi-byte characters, non-periodic."""
    rng = random.Random(0)
    words = ["café", "naïve", "über", "straße", "résumé", "the", "of", "and", "a", "déjà", "vu", "Ångström", "—",
             "日本語", "Zürich", "piñata", "fiancée", "x = 1", "print(x)", "::", "..", "``code``"]
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 14))) for _ in range(1500)]
    return ("\n".join(lines) + "\n").encode()


def _splits(out: Path) -> list[bytes]:
    return [(out / f"{s}.bin").read_bytes() for s in data.SPLITS]


def _prepare(tmp_path: Path, src: Path, name: str = "out", **keys) -> Path:
    out = tmp_path / name
    data.prepare("enwik8", corpus(source="file", path=str(src), **keys), out)
    return out


@pytest.fixture
def text_file(tmp_path) -> tuple[Path, bytes]:
    blob = _text()
    src = tmp_path / "mytext.txt"
    src.write_bytes(blob)
    return src, blob


def _zip(path: Path, blob: bytes) -> None:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("inner/mytext.txt", blob)


WRITERS = {
    "zip": _zip,
    "gzip": lambda p, b: p.write_bytes(gzip.compress(b)),
    "xz": lambda p, b: p.write_bytes(lzma.compress(b)),
    "bz2": lambda p, b: p.write_bytes(bz2.compress(b)),
}


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_an_archive_is_unpacked_to_the_plain_text_splits(tmp_path, text_file, fmt, caplog):
    src, blob = text_file
    plain = _prepare(tmp_path, src, "plain")
    packed = tmp_path / f"mytext.{fmt}.bin"  # a misleading name: the magic bytes decide, not the suffix
    WRITERS[fmt](packed, blob)
    with caplog.at_level(logging.WARNING):
        out = _prepare(tmp_path, packed, md5=hashlib.md5(packed.read_bytes()).hexdigest())  # MD5 of the file as given
    assert _splits(out) == _splits(plain) and b"".join(_splits(out)) == blob
    assert not caplog.records  # the unpacked text is text
    meta = json.loads((out / "meta.json").read_text())
    assert meta["unpacked"] == fmt and meta["md5"] == hashlib.md5(packed.read_bytes()).hexdigest()
    assert meta["text_md5"] == hashlib.md5(blob).hexdigest() and meta["text_bytes"] == len(blob)
    assert meta["file_bytes"] == packed.stat().st_size
    assert json.loads((plain / "meta.json").read_text())["unpacked"] is None


def test_a_zip_with_two_files_is_refused_naming_them(tmp_path, text_file):
    _, blob = text_file
    z = tmp_path / "two.zip"
    with zipfile.ZipFile(z, "w") as f:
        f.writestr("a.txt", blob)
        f.writestr("b.txt", blob)
    with pytest.raises(UserError, match="exactly one file") as e:
        _prepare(tmp_path, z)
    assert str(z) in str(e.value) and "a.txt" in str(e.value) and "b.txt" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_a_tar_or_zstd_file_is_refused_naming_the_format(tmp_path, text_file):
    import io
    import tarfile

    _, blob = text_file
    tgz = tmp_path / "texts.tar.gz"
    with tarfile.open(tgz, "w:gz") as t:
        info = tarfile.TarInfo("mytext.txt")
        info.size = len(blob)
        t.addfile(info, io.BytesIO(blob))
    with pytest.raises(UserError, match=r"tar archive \(inside the gzip file\)") as e:
        _prepare(tmp_path, tgz)
    assert str(tgz) in str(e.value)
    zst = tmp_path / "mytext.zst"
    zst.write_bytes(b"\x28\xb5\x2f\xfd" + blob)
    with pytest.raises(UserError, match=r"a zstd file.*unpacks only zip, gzip, xz and bz2") as e:
        _prepare(tmp_path, zst)
    assert str(zst) in str(e.value)


def test_a_damaged_archive_names_the_path_and_format(tmp_path, text_file):
    _, blob = text_file
    gz = tmp_path / "cut.gz"
    gz.write_bytes(gzip.compress(blob)[:-200])
    with pytest.raises(UserError, match=r"cut\.gz: looks like a gzip file .* cannot be unpacked"):
        _prepare(tmp_path, gz)


def test_a_random_binary_file_warns_with_its_fraction(tmp_path, caplog):
    src = tmp_path / "random.bin"
    src.write_bytes(random.Random(0).randbytes(64_000))
    with caplog.at_level(logging.WARNING):
        out = _prepare(tmp_path, src)
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
    msg = record.getMessage()
    assert "does not look like text" in msg and str(src) in msg and "local.corpora.enwik8" in msg
    frac, n = data.non_text_fraction(src.read_bytes())
    assert 0.4 < frac < 0.7 and f"{100 * frac:.1f}% of a {n}-byte sample" in msg
    assert json.loads((out / "meta.json").read_text())["non_text_fraction"] == round(frac, 4)
    assert b"".join(_splits(out)) == src.read_bytes()  # a warning, not a refusal


def test_utf8_text_and_real_prose_do_not_warn(tmp_path, text_file, caplog):
    src, _ = text_file
    prose = tmp_path / "prose.md"  # real human-written text (Markdown with typographic quotes and dashes)
    prose.write_bytes(b"\n".join((REPO / p).read_bytes() for p in ("README.md", "docs/sources.md")))
    with caplog.at_level(logging.WARNING):
        a = _prepare(tmp_path, src, "a")
        b = _prepare(tmp_path, prose, "b")
    assert not caplog.records
    for out in (a, b):
        assert json.loads((out / "meta.json").read_text())["non_text_fraction"] < 0.001


def test_non_text_fraction_samples_a_large_file():
    frac, n = data.non_text_fraction(random.Random(1).randbytes(3 << 20))
    assert abs(n - (1 << 20)) < 64 * 4 and frac > 0.4  # 64 chunks of 16 KiB, give or take a character
    frac, n = data.non_text_fraction(_text() * 40)  # chunks start and end on character boundaries
    assert frac == 0.0 and abs(n - (1 << 20)) < 64 * 4


def test_md5_mismatch_names_the_key_both_md5s_and_the_fix(tmp_path, text_file):
    src, blob = text_file
    actual = hashlib.md5(blob).hexdigest()
    inherited = "ffe3fd4a0f5469cba03458a8aed6d3b6"  # the cpu scale's python-docs MD5, kept by an override of path
    with pytest.raises(UserError) as e:
        _prepare(tmp_path, src, md5=inherited)
    msg = str(e.value)
    assert "local.corpora.enwik8.md5" in msg and inherited in msg and actual in msg and str(src) in msg
    assert 'md5: ""' in msg and f"md5: {actual}" in msg and "--configfile" in msg
    assert not (tmp_path / "out").exists()
    _prepare(tmp_path, src, md5=actual.upper())  # the actual MD5 (any case) passes


@pytest.fixture
def prepared(tmp_path, text_file) -> Path:
    src, _ = text_file
    return _prepare(tmp_path, src, "data")


def test_a_truncated_split_is_refused_naming_the_file_and_what_to_delete(prepared):
    train = prepared / "train.bin"
    blob = train.read_bytes()
    train.write_bytes(blob[:-1000])
    with pytest.raises(UserError) as e:
        data.load_split(prepared, "train")
    msg = str(e.value)
    assert str(train) in msg and f"size {len(blob) - 1000} bytes, expected {len(blob)}" in msg
    assert f"delete {prepared} and rerun" in msg
    assert len(data.load_split(prepared, "val")) == (prepared / "val.bin").stat().st_size  # the others still load


def test_flipped_bytes_at_the_same_size_are_refused(prepared):
    train = prepared / "train.bin"
    blob = bytearray(train.read_bytes())
    for i in (10, 5000, len(blob) - 1):
        blob[i] ^= 0x01
    train.write_bytes(bytes(blob))
    assert train.stat().st_size == json.loads((prepared / "meta.json").read_text())["sizes"]["train"]
    with pytest.raises(UserError) as e:
        data.load_split(prepared, "train")
    msg = str(e.value)
    assert str(train) in msg and "MD5" in msg and f"delete {prepared} and rerun" in msg
