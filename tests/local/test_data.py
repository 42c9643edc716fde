"""Data download/verify on local fixtures (file:// URLs patched in for the canonical ones), corrupt files,
the TinyStories split, and determinism of the embedded corpora."""

from __future__ import annotations

import hashlib
import zipfile

import pytest

from gradfidelity.errors import UserError
from gradfidelity.studies.local import data
from tests.local._config import corpus


def _zip_fixture(tmp_path, payload: bytes, name: str = "enwik8"):
    z = tmp_path / "src" / "enwik8.zip"
    z.parent.mkdir()
    with zipfile.ZipFile(z, "w") as f:
        f.writestr(name, payload)
    return z


@pytest.fixture
def fake_enwik8(tmp_path, monkeypatch):
    payload = bytes(range(256)) * 4 + b"tail"  # 1028 bytes
    z = _zip_fixture(tmp_path, payload)
    monkeypatch.setattr(data, "ENWIK8_URL", z.as_uri())
    monkeypatch.setattr(data, "ENWIK8_SIZE", len(payload))
    monkeypatch.setattr(data, "ENWIK8_MD5", hashlib.md5(payload).hexdigest())
    monkeypatch.setattr(data, "ENWIK8_SPLIT", (1000, 20, 8))
    return payload, z


def test_enwik8_download_verify_split(tmp_path, fake_enwik8):
    payload, _ = fake_enwik8
    out = tmp_path / "out"
    data.prepare("enwik8", corpus(source="download"), out)
    assert (out / "train.bin").read_bytes() == payload[:1000]
    assert (out / "val.bin").read_bytes() == payload[1000:1020]
    assert (out / "test.bin").read_bytes() == payload[1020:]
    assert not (out / "enwik8").exists()  # the unzipped copy is not kept twice


def test_enwik8_local_copy(tmp_path, fake_enwik8):
    payload, z = fake_enwik8
    data.prepare("enwik8", corpus(source="path", path=str(z)), tmp_path / "out")
    assert (tmp_path / "out" / "val.bin").read_bytes() == payload[1000:1020]


def test_enwik8_corrupt_md5_names_the_file(tmp_path, fake_enwik8, monkeypatch):
    payload, _ = fake_enwik8
    bad = bytearray(payload)
    bad[500] ^= 0xFF  # same size, one flipped byte
    (tmp_path / "x").mkdir()
    z = _zip_fixture(tmp_path / "x", bytes(bad))
    monkeypatch.setattr(data, "ENWIK8_URL", z.as_uri())
    out = tmp_path / "out"
    with pytest.raises(UserError, match="MD5") as e:
        data.prepare("enwik8", corpus(source="download"), out)
    assert str(out / "enwik8") in str(e.value)


def test_enwik8_wrong_size(tmp_path, fake_enwik8, monkeypatch):
    payload, _ = fake_enwik8
    (tmp_path / "y").mkdir()
    z = _zip_fixture(tmp_path / "y", payload[:-1])
    monkeypatch.setattr(data, "ENWIK8_URL", z.as_uri())
    with pytest.raises(UserError, match="size 1027 bytes, expected 1028"):
        data.prepare("enwik8", corpus(source="download"), tmp_path / "out")


def test_missing_url_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "ENWIK8_URL", (tmp_path / "nope.zip").as_uri())
    with pytest.raises(UserError, match="could not download"):
        data.prepare("enwik8", corpus(source="download"), tmp_path / "out")


def _stories(n: int, tag: str) -> bytes:
    return "".join(f"Story {tag}{i} about a cat.\n{data.EOT}\n" for i in range(n)).encode()


def test_tinystories_download_and_split(tmp_path, monkeypatch):
    src = tmp_path / "hf"
    src.mkdir()
    (src / data.TINYSTORIES_FILES["train"]).write_bytes(_stories(10, "t"))
    (src / data.TINYSTORIES_FILES["valid"]).write_bytes(_stories(4, "v"))
    monkeypatch.setattr(data, "TINYSTORIES_BASE", src.as_uri() + "/")
    out = tmp_path / "out"
    data.prepare("tinystories", corpus(source="download"), out)
    assert (out / "train.bin").read_bytes() == _stories(10, "t")
    val, test = (out / "val.bin").read_bytes(), (out / "test.bin").read_bytes()
    assert b"v0" in val and b"v1" in val and b"v2" not in val
    assert b"v2" in test and b"v3" in test and b"v0" not in test


def test_tinystories_without_separator_is_rejected(tmp_path):
    src = tmp_path / "hf"
    src.mkdir()
    (src / data.TINYSTORIES_FILES["train"]).write_bytes(b"no separators here")
    (src / data.TINYSTORIES_FILES["valid"]).write_bytes(_stories(2, "v"))
    with pytest.raises(UserError, match="TinyStoriesV2-GPT4-train.txt"):
        data.prepare("tinystories", corpus(source="path", path=str(src)), tmp_path / "out")


def test_embedded_corpora_are_deterministic_and_shaped(tmp_path):
    a = data.embedded_enwik8(50_000)
    assert a == data.embedded_enwik8(50_000) and len(a) == 50_000
    assert a != data.embedded_enwik8(50_000, seed=9)
    assert a.startswith(b"  <page>") and b"[[" in a
    t = data.embedded_tinystories(20_000)
    assert t == data.embedded_tinystories(20_000) and t.count(data.EOT.encode()) > 20
    data.prepare("tinystories", corpus(embedded_bytes=20_000), tmp_path / "ts")
    sizes = [(tmp_path / "ts" / f"{s}.bin").stat().st_size for s in data.SPLITS]
    assert sizes == [18_000, 1_000, 1_000]


def test_batches_are_shifted_and_seeded():
    stream = data.torch.arange(256, dtype=data.torch.uint8).repeat(4)
    offs = data.batch_offsets(len(stream), 16, 3, 5, seed=1)
    assert data.torch.equal(offs, data.batch_offsets(len(stream), 16, 3, 5, seed=1))
    assert not data.torch.equal(offs, data.batch_offsets(len(stream), 16, 3, 5, seed=2))
    x, y = data.get_batch(stream, offs[0], 16)
    assert x.shape == (3, 16) and data.torch.equal(x[:, 1:], y[:, :-1])
    assert data.torch.equal(y[:, -1], stream[offs[0] + 16].long())


def test_any_byte_file_is_split_and_its_md5_recorded(tmp_path):
    """source: file takes the user's own text (round 1 refused a 1 MB excerpt of enwik8 by its size)."""
    import hashlib
    import json

    from gradfidelity.studies.local.data import prepare

    blob = bytes(range(256)) * 400  # 102,400 bytes, not any canonical size
    src = tmp_path / "mytext.txt"
    src.write_bytes(blob)
    prepare("enwik8", corpus(source="file", path=str(src), split=[0.8, 0.1, 0.1]), tmp_path / "out")
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["md5"] == hashlib.md5(blob).hexdigest() and meta["source"] == "file:mytext.txt"
    parts = [(tmp_path / "out" / f"{k}.bin").read_bytes() for k in ("train", "val", "test")]
    assert b"".join(parts) == blob and len(parts[0]) == int(0.8 * len(blob))
    with pytest.raises(UserError, match="expected 0123"):
        prepare("enwik8", corpus(source="file", path=str(src), md5="0123"), tmp_path / "bad")
    assert not (tmp_path / "bad" / "meta.json").exists()
    with pytest.raises(UserError, match="is not a file"):
        prepare("enwik8", corpus(source="file", path=str(tmp_path / "nope")), tmp_path / "none")


def test_a_damaged_or_truncated_split_is_refused_before_training(tmp_path):
    """meta.json holds each split's size and MD5; load_split checks both (round 2 trained on what was left of a
    truncated train.bin)."""
    import json

    from gradfidelity.studies.local.data import load_split, prepare

    src = tmp_path / "text.txt"
    src.write_bytes(b"the quick brown fox jumps over the lazy dog\n" * 2000)
    out = tmp_path / "data"
    prepare("enwik8", corpus(source="file", path=str(src)), out)
    train = load_split(out, "train")
    assert len(train) == json.loads((out / "meta.json").read_text())["sizes"]["train"]

    blob = bytearray((out / "train.bin").read_bytes())
    blob[100] ^= 0x20  # one letter's case: the size is unchanged, only the hash can tell
    (out / "train.bin").write_bytes(bytes(blob))
    with pytest.raises(UserError, match=r"train\.bin: MD5 .*delete .*data and rerun"):
        load_split(out, "train")
    (out / "train.bin").write_bytes(bytes(blob[: len(blob) * 7 // 9]))
    with pytest.raises(UserError, match=r"train\.bin: size .*expected"):
        load_split(out, "train")
    load_split(out, "val")  # the intact split still loads

    meta = json.loads((out / "meta.json").read_text())
    del meta["split_md5"]  # prepared by an older version: nothing to check against
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="records no size or MD5"):
        load_split(out, "val")
